"""A ladder as scaling points: one row per finished rung with its variant, size, training
FLOPs and final eval loss; power-law fits per variant; groups of rungs at equal compute."""

from __future__ import annotations

import pandas as pd

from depthscale.results.fits import Fit, fit_power_law
from depthscale.results.flops import ISOFLOP_TOLERANCE, isoflop_groups, training_flops

DEPTH_FIELDS = ('model.num_layers', 'model.d_model', 'model.num_heads', 'model.d_ff',
                'model.mlp_ratio')  # what a depth or width-depth sweep varies
SEED_FIELDS = ('train.seed',)  # what repeats a rung
AGAINST = {'params': ('params', 'non-embedding params N', 10),  # column, name, log base of x
           'depth': ('L', 'depth L', 2)}


def variant_labels(configs: pd.DataFrame, ignore: tuple[str, ...] = DEPTH_FIELDS) -> dict[str, str]:
  """Rung -> variant: the config fields that differ across rungs, those in `ignore` excluded."""
  varying = [c for c in configs.columns if c != 'rung' and c not in ignore
             and configs[c].astype(str).nunique() > 1]
  return {row.rung: ','.join(f'{c.split(".")[-1]}={row[c]}' for c in varying) or 'all'
          for _, row in configs.iterrows()}


def _compute_params(summary: pd.Series) -> float:
  n = summary.get('compute_params', float('nan'))
  return summary['non_embedding_params'] if pd.isna(n) else n


def rung_flops(configs: pd.DataFrame, summaries: pd.DataFrame) -> list[float]:
  """Training FLOPs of each summary's rung (flops.training_flops); N counts a looped block once
  per loop (summaries written before that count was kept fall back to non_embedding_params)."""
  cfg = configs.set_index('rung')
  return [training_flops(_compute_params(s), s['tokens'],
                         *(cfg.loc[s.rung, f] for f in ('model.num_layers', 'data.seq_len',
                                                        'model.d_model')))
          for _, s in summaries.iterrows()]


def points(configs: pd.DataFrame, summaries: pd.DataFrame) -> pd.DataFrame:
  """One row per finished rung: rung, variant (seeds merged), seed, L, D, params (non-embedding),
  tokens, flops, loss (final eval loss)."""
  cfg = configs.set_index('rung')
  labels = variant_labels(configs, DEPTH_FIELDS + SEED_FIELDS)
  return pd.DataFrame(
      [{'rung': s.rung, 'variant': labels[s.rung], 'seed': cfg.loc[s.rung, 'train.seed'],
        'L': int(cfg.loc[s.rung, 'model.num_layers']), 'D': int(cfg.loc[s.rung, 'model.d_model']),
        'params': s['non_embedding_params'], 'tokens': s['tokens'], 'flops': f,
        'loss': s['final_eval_loss']}
       for (_, s), f in zip(summaries.iterrows(), rung_flops(configs, summaries))],
      columns=['rung', 'variant', 'seed', 'L', 'D', 'params', 'tokens', 'flops', 'loss'])


def fit(pts: pd.DataFrame, against: str = 'params') -> list[Fit]:
  """Per variant, final eval loss vs non-embedding params ('params') or, per variant and
  width D, vs depth ('depth'): fits.fit_power_law of each curve."""
  if against not in AGAINST:
    raise ValueError(f'against={against!r}: allowed {sorted(AGAINST)}')
  column, name, _ = AGAINST[against]
  keys = ['variant'] if against == 'params' else ['variant', 'D']
  out = []
  for key, g in pts.groupby(keys, sort=True):
    where = key[0] if against == 'params' else f'{key[0]}, D={key[1]}'
    out.append(fit_power_law(g[column], g['loss'], f'{where}: loss vs {name}'))
  return out


def isoflop(pts: pd.DataFrame, tolerance: float = ISOFLOP_TOLERANCE) -> list[pd.DataFrame]:
  """The groups of rungs whose training FLOPs agree within `tolerance` (flops.isoflop_groups)
  and that hold more than one depth: width against depth at equal compute."""
  groups = [pts.iloc[i].sort_values(['variant', 'L'])
            for i in isoflop_groups(pts['flops'], tolerance)]
  return [g for g in groups if g['L'].nunique() > 1]
