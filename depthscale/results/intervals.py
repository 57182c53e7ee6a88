"""Learning-rate sweeps as results (ladder.lr_sweep): per variant its best rate and the mean
final eval loss of the seeds at that rate with a 95% Student-t interval; a ranking that
orders two variants only when their intervals separate."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pandas as pd
from scipy import stats

from depthscale import ladder

LEVEL = 0.95  # interval coverage
SEED_PART = re.compile(r'(_best|_top\d+)?' + ladder.SEED.pattern)  # '_s<k>'; lr_sweep's '_best_s<k>'
COLUMNS = ['variant', 'lr', 'rates', 'edge', 'seeds', 'mean', 'low', 'high', 'rank']


def variant(rung: str) -> str:
  """The rung name without its seed part: 'post_ln_s2' -> 'post_ln', 'pre_ln_best_s1' and
  'pre_ln_top2_s1' -> 'pre_ln', 'pre_ln_s0_d64_L8' -> 'pre_ln_d64_L8'."""
  return SEED_PART.sub('', rung)


def finalist(values: pd.Series, lr: pd.Series) -> pd.Index:
  """Of one variant's rungs (values: rung -> final value; lr: rung -> optim.lr), those at the
  rate with the lowest mean over its seeds: a sweep's stage 2 trains several finalist rates
  (ladder.lr_sweep), other ladders one."""
  rates = lr[values.index]
  return values.index[rates == values.groupby(rates).mean().idxmin()]


def paired_interval(a, b, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high) of the per-seed differences a - b (equal-length, seed-aligned): the
  Student-t interval of the differences, what scipy.stats.ttest_rel's confidence interval
  gives."""
  return t_interval(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), level)


def t_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high): mean -+ t_{(1 + level)/2, n - 1} s / sqrt(n), s the sample standard
  deviation (ddof 1); the bounds are nan with fewer than 2 values."""
  v = np.asarray(values, dtype=np.float64)
  mean = float(v.mean())
  if v.size < 2:
    return mean, float('nan'), float('nan')
  half = stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
  return mean, mean - half, mean + half


def order(a: tuple[float, float], b: tuple[float, float]) -> int:
  """-1 if interval a (low, high) lies wholly below b, 1 if wholly above, 0 (tied) if they
  overlap or either is unknown (nan)."""
  return -1 if a[1] < b[0] else 1 if a[0] > b[1] else 0


def sweep_table(choices: pd.DataFrame, summaries: pd.DataFrame, configs: pd.DataFrame,
                level: float = LEVEL) -> pd.DataFrame:
  """One row per swept variant: variant, lr (its best rate: of the stage-2 finalists, the
  one with the lowest mean over seeds), rates (stage-1 rates compared,
  extensions past the grid included), edge ('lowest' / 'highest' where the best rate is the
  lowest / highest of those: the optimum may lie beyond it; '' inside), seeds (finished
  stage-2 rungs), mean, low, high (final eval loss, `level` Student-t interval over the
  seeds), rank (1 + the variants whose interval lies wholly below). From Results.choices (the
  stage-2 rungs' best_lr.json), Results.summaries and Results.configs (the rates)."""
  loss = summaries.set_index('rung')['final_eval_loss'] if len(summaries) else pd.Series()
  rows = []
  for name, g in choices.groupby(choices.rung.map(variant), sort=False):
    g = g[g.rung.isin(loss.index)]
    if len(g):
      g = g[g.rung.isin(finalist(loss[g.rung], g.set_index('rung').lr))]
      mean, low, high = t_interval(loss[g.rung], level)
      rows.append({'variant': name, 'lr': g.lr.iloc[0], 'rates': len(g.losses.iloc[0]),
                   'edge': edge(g.lr.iloc[0], g.losses.iloc[0], configs),
                   'seeds': len(g), 'mean': mean, 'low': low, 'high': high})
  out = pd.DataFrame(rows, columns=COLUMNS[:-1])
  out['rank'] = [1 + sum(order((l2, h2), (l, h)) < 0 for l2, h2 in zip(out.low, out.high))
                 for l, h in zip(out.low, out.high)]
  return out.sort_values(['rank', 'mean'], ignore_index=True)


def rate_points(choices: pd.DataFrame, summaries: pd.DataFrame,
                configs: pd.DataFrame) -> pd.DataFrame:
  """Every finished rung of each swept variant as (variant, rung, lr, seed, loss): its stage-1
  rungs (seed 0, one per rate) and its stage-2 seeds at each finalist rate."""
  loss = summaries.set_index('rung')['final_eval_loss'] if len(summaries) else pd.Series()
  cfg = configs.set_index('rung')
  rows = []
  for name, g in choices.groupby(choices.rung.map(variant), sort=False):
    for rung in [r for r in g.losses.iloc[0] if r in loss.index] + list(g.rung[g.rung.isin(loss.index)]):
      rows.append({'variant': name, 'rung': rung, 'lr': cfg.loc[rung, 'optim.lr'],
                   'seed': int(cfg.loc[rung, 'train.seed']), 'loss': loss[rung]})
  return pd.DataFrame(rows, columns=['variant', 'rung', 'lr', 'seed', 'loss'])


def edge(best: float, losses: dict, configs: pd.DataFrame) -> str:
  """'lowest' / 'highest' if best is the lowest / highest rate (optim.lr in configs, one row
  per rung) of the stage-1 rungs in losses, the grid's and its extensions', else ''."""
  lr = configs.set_index('rung')['optim.lr']
  rates = [lr[name] for name in losses if name in lr.index]
  if len(rates) < 2:
    return ''
  return 'lowest' if best <= min(rates) else 'highest' if best >= max(rates) else ''


def ranking(table: pd.DataFrame) -> list[str]:
  """One line per pair of variants of a sweep_table, lower mean first: 'A < B' where the
  intervals separate, else 'A ~ B (tied)'."""
  pairs = itertools.combinations(table.sort_values('mean').itertuples(), 2)
  return [f'{a.variant} < {b.variant}' if order((a.low, a.high), (b.low, b.high)) < 0
          else f'{a.variant} ~ {b.variant} (tied)' for a, b in pairs]
