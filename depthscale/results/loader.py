"""Notebook loader of a ladder directory or its kept record: `depthscale.results.load('runs/quickstart')`,
`depthscale.results.load('records/method_survey.tokens20.json.gz')`."""

from __future__ import annotations

import dataclasses
import pandas as pd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale import storage, sweep
from depthscale.config import flatten
from depthscale.results import intervals, rankings, records, scaling
from depthscale.results.fits import Fit
from depthscale.results.flops import ISOFLOP_TOLERANCE

SCALAR_LOGS = records.JSONL_FILES[1:]  # train, eval and analysis logs
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

  def rate_points(self) -> pd.DataFrame:
    """Per swept variant, every finished rung as (variant, rung, lr, seed, loss): the
    stage-1 rates and the stage-2 seeds at each finalist (intervals.rate_points)."""
    return intervals.rate_points(self.choices, self.summaries, self.configs)

  def ranking(self, fractions: tuple[float, ...] = rankings.FRACTIONS) -> rankings.Ranking:
    """The finished rungs' variants ranked by mean eval loss over seeds at the eval logged
    nearest to each fraction of the steps (default 50% and 100%): .table, .orders, .stable
    (the same order at every fraction), .describe() (rankings.ranking)."""
    return rankings.ranking(self.configs, self.summaries, self.scalars, fractions)


def load(ladder: str) -> Results:
  """Reads every rung (finished or not) of a ladder directory, or of its kept record
  (records.pack: a '.json.gz' file), into DataFrames."""
  rungs = records.read(ladder)[0] if records.is_record(ladder) else records.read_ladder(ladder)
  configs, summaries, layers, scalars, choices = [], [], [], [], []
  for rung, files in rungs.items():
    configs.append({'rung': rung, **flatten(files['config.json'])})
    if 'summary.json' in files:
      summaries.append({'rung': rung, **files['summary.json']})
    if sweep.CHOICE_FILE in files:
      choices.append({'rung': rung, **files[sweep.CHOICE_FILE]})
    for r in files.get('layer_metrics.jsonl', []):
      layers.extend({'rung': rung, 'step': r['step'], 'metric': k, 'layer': l + 1, 'value': v}
                    for k, vs in r.items() if k != 'step' for l, v in enumerate(vs))
    for log in SCALAR_LOGS:
      scalars.extend({'rung': rung, 'step': r['step'], 'tag': k, 'value': v}
                     for r in files.get(log, []) for k, v in r.items() if k != 'step')
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
