"""Helpers of the paper notebooks (notebooks/*.py): the smoke switch, output folders,
per-layer profiles from `depthscale.results.load(DIR).layers`, gradient norms at init
without a training run, the notebook's rows of the claims table, its natural-text run,
and figure saving."""

from __future__ import annotations

import os

import jax
import matplotlib.pyplot as plt
import numpy as np
import optax
import pandas as pd

from depthscale import data, natural_text, storage
from depthscale.experiment import run_ladder
from depthscale.launch import run as launch
from depthscale.ladder import split_seed
from depthscale.model.stats import per_layer_norm
from depthscale.model.transformer import make_model
from depthscale.results import claims, loader, plots
from depthscale.training.steps import init_state, weighted_loss

SMOKE_ENV = 'DEPTHSCALE_SMOKE'  # '1': every run shrinks so a notebook runs in CI in seconds
OUTPUTS_ENV = 'DEPTHSCALE_NOTEBOOK_OUTPUTS'  # where runs and PNGs go (default: outputs/)
LAUNCH_ENV = 'DEPTHSCALE_NOTEBOOK_LAUNCH'  # '1': ladders run on a Ray cluster, in parallel


def smoke() -> bool:
  """True when DEPTHSCALE_SMOKE=1: the notebook runs its smallest size."""
  return os.environ.get(SMOKE_ENV, '') == '1'


def outputs(name: str) -> str:
  """The notebook's output folder (created): $DEPTHSCALE_NOTEBOOK_OUTPUTS/name or outputs/name."""
  path = storage.join(os.environ.get(OUTPUTS_ENV, 'outputs'), name)
  storage.makedirs(path)
  return path


def run(experiment: str, ladder_dir: str):
  """Trains the ladder (finished rungs are reused) and loads it: (run_ladder's table rows,
  depthscale.results.Results, variant -> its rungs). With DEPTHSCALE_NOTEBOOK_LAUNCH=1 the
  rungs run through depthscale.launch (RAY_ADDRESS's cluster or a local Ray instance)."""
  rows = (launch.run_ladder if os.environ.get(LAUNCH_ENV) == '1' else run_ladder)(
      experiment, ladder_dir)
  return rows, loader.load(ladder_dir), by_variant(r['rung'] for r in rows)


def claims_rows(experiment: str, size: str, res: loader.Results,
                expected: dict[str, dict[str, str]]) -> dict[str, str]:
  """This ladder's rows of the claims table (docs/claims.md, claims.evaluate) at `size`:
  prints each row's measured values and verdict and returns claim -> verdict of the rows
  it measures. Asserts they are expected[size]; a size without recorded verdicts is said
  so and not asserted."""
  table = claims.evaluate({(experiment, size): res})
  ours = table[table.measured_by == f'{experiment}:{size}'].set_index('claim')
  print(ours[['measured', 'verdict']].to_string())
  measured = ours.verdict[ours.verdict != claims.NOT_MEASURED].to_dict()
  if size not in expected:
    print(f'no verdicts recorded for size {size!r} (recorded: {", ".join(expected) or "none"}): '
          'the verdicts above are reported, not asserted')
    return measured
  assert measured == expected[size], f'verdicts at {size}: {measured}, expected {expected[size]}'
  print('claims verdicts as expected at', size)
  return measured


def natural_text_run(experiment: str, size: str, out_dir: str):
  """Trains the experiment file's `<size>-text` ladder (python_docs, depthscale.natural_text)
  in out_dir/runs_<size>_text and prints the corpus hash, each variant's mean eval loss
  (final, and at the eval nearest half the steps) and its ranking at 50% and 100% of the
  steps, 'stable' or 'changed'. Returns (rows, Results, variant -> rungs, Ranking)."""
  rows, res, groups = run(f'{experiment}:{size}{natural_text.SUFFIX}',
                          storage.join(out_dir, f'runs_{size}_text'))
  print(f'{natural_text.CORPUS} sha256:', res.summaries.data_sha256.iloc[0])
  rank = res.ranking()
  print(rank.table.to_string(float_format='{:.3f}'.format))
  print(rank.describe())
  return rows, res, groups, rank


def loss_curves(scalars: pd.DataFrame, groups: dict[str, list[str]], title: str,
                reference: tuple[str, float] | None = None):
  """Figure of train loss vs step from a Results.scalars table, one color per variant
  (all its rungs), with an optional horizontal reference line (label, value)."""
  fig, ax = plt.subplots(figsize=(6, 3.8))
  for i, (name, rungs) in enumerate(groups.items()):
    for j, r in enumerate(rungs):
      log = scalars[(scalars.rung == r) & (scalars.tag == 'train/loss')]
      ax.plot(log.step, log.value, color=f'C{i}', label=name if j == 0 else None)
  if reference:
    ax.axhline(reference[1], color='k', ls='--', lw=1, label=reference[0])
  ax.set(xlabel='step', ylabel='train loss', title=title)
  ax.legend()
  return fig


def profile(layers: pd.DataFrame, rung: str, metric: str, step: int | str = 'last') -> np.ndarray:
  """One metric per layer (block 1 first) of one rung at a logged step ('first', 'last' or
  a step number), from the long table (rung, step, metric, layer, value)."""
  df = layers[(layers.rung == rung) & (layers.metric == metric)]
  if df.empty:
    raise KeyError(f'no {metric!r} logged for rung {rung!r}')
  at = {'first': df.step.min(), 'last': df.step.max()}.get(step, step)
  return df[df.step == at].sort_values('layer').value.to_numpy()


def init_grad_norms(cfg, seeds: list[int] | None = None) -> np.ndarray:
  """Per-block gradient norms at init on the first training batch, one row per seed
  (default cfg.train.seed), block 1 first: the `grad_norm` of a run's step-0 record, for
  one compile instead of a training run per seed."""
  model = make_model(cfg)

  @jax.jit
  def grad_norms(params, batch):
    loss = lambda p: weighted_loss(model.apply({'params': p}, batch['inputs'])[0], batch)
    return per_layer_norm(jax.grad(loss)(params)['blocks'])

  init = jax.jit(init_state, static_argnums=(0, 1, 3))
  rows = []
  for seed in seeds if seeds is not None else [cfg.train.seed]:
    params = init(model, optax.identity(), seed, cfg.data.seq_len)['params']
    rows.append(np.asarray(grad_norms(params, next(data.train_iterator(cfg.data, seed)))))
  return np.stack(rows)


def profiles_figure(layers: pd.DataFrame, rungs: dict[str, str], metric: str, step, title: str):
  """Figure of one metric per block (log scale) at a logged step, one line per labelled rung."""
  fig, ax = plt.subplots(figsize=(5.5, 3.8))
  for label, rung in rungs.items():
    prof = profile(layers, rung, metric, step)
    ax.semilogy(np.arange(1, len(prof) + 1), prof, marker='o', label=label)
  ax.set(xlabel='block l', ylabel=metric, title=title)
  ax.legend()
  return fig


def variant(rung: str) -> str:
  """The variant of a rung named '<variant>_s<seed>[_<shape>]' (the seed and shape dropped)."""
  return split_seed(rung)[0]


def by_variant(rungs) -> dict[str, list[str]]:
  """Variant -> its rungs (all seeds and shapes), in first-seen order."""
  out: dict[str, list[str]] = {}
  for r in rungs:
    out.setdefault(variant(r), []).append(r)
  return out


def mean_std(values) -> str:
  """'mean ± std' (std over seeds, ddof 1; '± n/a' with one value)."""
  v = np.asarray(values, dtype=float)
  spread = f'{v.std(ddof=1):.3g}' if v.size > 1 else 'n/a'
  return f'{v.mean():.3g} ± {spread}'


def save(fig, out_dir: str, name: str) -> str:
  """Writes the figure as out_dir/name.png (150 dpi) and returns the path."""
  path = storage.join(out_dir, f'{name}.png')
  plots.save(fig, path, dpi=150, bbox_inches='tight')
  return path
