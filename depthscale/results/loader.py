"""Notebook loader of a ladder directory: `depthscale.results.load('runs/quickstart')`."""

from __future__ import annotations

import dataclasses
import pandas as pd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale import storage, sweep
from depthscale.results import intervals, rankings, scaling
from depthscale.results.fits import Fit
from depthscale.results.flops import ISOFLOP_TOLERANCE

SCALAR_LOGS = ('train_log.jsonl', 'eval_log.jsonl', 'analysis_log.jsonl')
CHOICE_COLUMNS = ['rung', 'lr', 'from', 'losses']


@dataclasses.dataclass
class Results:
  """The rungs of one ladder as DataFrames, each with a 'rung' column.

  configs: one row per rung, the config flattened to dotted columns ('model.num_layers').
  summaries: one row per finished rung, the fields of summary.json and `flops`, its training
    FLOPs (depthscale.results.flops.training_flops).
  layers: long format, one row per (rung, step, metric, layer), layer 1-based; analysis
    records share the 'step' of the training log they sit next to.
  scalars: long format, one row per (rung, step, tag) from the train, eval and analysis logs.
  choices: one row per stage-2 rung of a learning-rate sweep (ladder.lr_sweep): rung, lr
    (the best rate it trained at), from (the stage-1 rung chosen), losses (stage-1 rung ->
    final eval loss, None if diverged; extensions that trained included), from its
    best_lr.json. A not-needed extension rung trained nothing: it has no config.json and
    appears in no frame.
  """
  configs: pd.DataFrame
  summaries: pd.DataFrame
  layers: pd.DataFrame
  scalars: pd.DataFrame
  choices: pd.DataFrame = dataclasses.field(
      default_factory=lambda: pd.DataFrame(columns=CHOICE_COLUMNS))

  def final_profile(self, rung: str) -> dict[str, list[float]]:
    """Per metric, its values per layer at the last step it was logged in this rung."""
    df = self.layers[self.layers.rung == rung]
    last = df[df.step == df.groupby('metric').step.transform('max')]
    return {m: g.sort_values('layer').value.tolist() for m, g in last.groupby('metric')}

  def points(self) -> pd.DataFrame:
    """One row per finished rung: rung, variant (seeds merged), seed, L, D, params, tokens,
    flops, loss (final eval loss)."""
    return scaling.points(self.configs, self.summaries)

  def fit(self, against: str = 'params') -> list[Fit]:
    """Power-law fits of final eval loss per variant, against 'params' (non-embedding) or
    'depth' (per width); each Fit has params, intervals, predict(x), describe()."""
    return scaling.fit(self.points(), against)

  def isoflop(self, tolerance: float = ISOFLOP_TOLERANCE) -> list[pd.DataFrame]:
    """Groups of points at equal training FLOPs (within tolerance) holding several depths."""
    return scaling.isoflop(self.points(), tolerance)

  def sweep(self, level: float = intervals.LEVEL) -> pd.DataFrame:
    """Per variant of a learning-rate sweep: its best rate, seeds, mean final eval loss with
    a Student-t interval, and rank (intervals.sweep_table); empty without a sweep."""
    return intervals.sweep_table(self.choices, self.summaries, self.configs, level)

  def ranking(self, fractions: tuple[float, ...] = rankings.FRACTIONS) -> rankings.Ranking:
    """The finished rungs' variants ranked by mean eval loss over seeds at the eval logged
    nearest to each fraction of the steps (default 50% and 100%): .table, .orders, .stable
    (the same order at every fraction), .describe() (rankings.ranking)."""
    return rankings.ranking(self.configs, self.summaries, self.scalars, fractions)


def flatten(d: dict, prefix: str = '') -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1}."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def rung_dirs(ladder_dir: str) -> list[str]:
  """Names of the rung directories (those holding a config.json), sorted."""
  return [d for d in storage.listdir(ladder_dir)
          if storage.isfile(storage.join(ladder_dir, d, 'config.json'))]


def load(ladder_dir: str) -> Results:
  """Reads every rung of a ladder directory (finished or not) into DataFrames."""
  configs, summaries, layers, scalars, choices = [], [], [], [], []
  for rung in rung_dirs(ladder_dir):
    path = lambda f, rung=rung: storage.join(ladder_dir, rung, f)
    configs.append({'rung': rung, **flatten(storage.read_json(path('config.json')))})
    if storage.exists(path('summary.json')):
      summaries.append({'rung': rung, **storage.read_json(path('summary.json'))})
    if storage.exists(path(sweep.CHOICE_FILE)):
      choices.append({'rung': rung, **storage.read_json(path(sweep.CHOICE_FILE))})
    for r in storage.read_jsonl(path('layer_metrics.jsonl')):
      layers.extend({'rung': rung, 'step': r['step'], 'metric': k, 'layer': l + 1, 'value': v}
                    for k, vs in r.items() if k != 'step' for l, v in enumerate(vs))
    for log in SCALAR_LOGS:
      scalars.extend({'rung': rung, 'step': r['step'], 'tag': k, 'value': v}
                     for r in storage.read_jsonl(path(log)) for k, v in r.items() if k != 'step')
  frame = lambda rows, cols: pd.DataFrame(rows, columns=None if rows else cols)
  configs, summaries = frame(configs, ['rung']), frame(summaries, ['rung'])
  summaries['flops'] = scaling.rung_flops(configs, summaries)
  return Results(configs, summaries,
                 frame(layers, ['rung', 'step', 'metric', 'layer', 'value']),
                 frame(scalars, ['rung', 'step', 'tag', 'value']), frame(choices, CHOICE_COLUMNS))


def tensorboard_duplicates(rung_dir: str) -> dict[str, list[int]]:
  """Per scalar tag, the steps that TensorBoard (its EventAccumulator, which drops the points
  a resumed run's SessionLog START orphans) shows more than once; {} if none."""
  acc = EventAccumulator(rung_dir, size_guidance={'scalars': 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()['scalars']:
    steps = [e.step for e in acc.Scalars(tag)]
    repeated = sorted({s for s in steps if steps.count(s) > 1})
    if repeated:
      out[tag] = repeated
  return out
