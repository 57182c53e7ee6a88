"""Coordinate check: train a few steps across widths or depths and plot per-layer activation
scales vs step, so muP / CompleteP stay flat where the standard parametrization drifts.

  python -m depthscale.coord_check --config=experiments/FILE.py[:ARG] --vary=d_model \
      --out=DIR [--values=32,64,128,256] [--steps=8] [--config.model.parametrization=mup]

Writes DIR/coord_check.csv (rung, value, step, layer, act_rms, update_ratio, loss) and
DIR/coord_check.png: one panel per block position (first, middle, last), act_rms vs the
varied size, one line per step.
"""

from __future__ import annotations

import sys

import jax
import matplotlib
from matplotlib.figure import Figure
import pandas as pd
from absl import app, flags
from ml_collections import config_flags

from depthscale import data, storage
from depthscale.config import ConfigError, validate
from depthscale.model.transformer import make_model
from depthscale.results import plots
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment file[:arg].', lock_config=True)
_VARY = flags.DEFINE_enum('vary', 'd_model', ['d_model', 'num_layers'], 'Size to sweep.')
_VALUES = flags.DEFINE_list('values', None, 'Sizes (default: the config value times 1, 2, 4, 8).')
_STEPS = flags.DEFINE_integer('steps', 8, 'Training steps per rung.')
_OUT = flags.DEFINE_string('out', None, 'Output directory for the CSV and PNG.')


def rung_config(cfg, vary: str, value: int):
  """cfg with model.<vary> = value (heads kept; unset base sizes become the config's own)."""
  c = cfg.copy_and_resolve_references()
  c.model.base_d_model = c.model.base_d_model or cfg.model.d_model
  c.model.base_num_layers = c.model.base_num_layers or cfg.model.num_layers
  c.model[vary] = value
  return c


def run_rung(cfg, steps: int) -> list[dict]:
  """Trains `steps` steps with per-layer statistics on every step; one row per (step, layer)."""
  model, tx = make_model(cfg, collect_stats=True), make_optimizer(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, cfg.train.seed, cfg.data.seq_len)
  step_fn = jax.jit(make_train_step(model, tx, schedule(cfg), cfg))
  it = data.train_iterator(cfg.data, cfg.train.seed)
  rows = []
  for s in range(steps):
    state, out = step_fn(state, next(it))
    out = jax.device_get(out)
    for l, (rms, ratio) in enumerate(zip(out['layers']['act_rms'], out['layers']['update_ratio'])):
      rows.append({'step': s, 'layer': l + 1, 'act_rms': float(rms), 'update_ratio': float(ratio),
                   'loss': float(out['loss'])})
  return rows


def plot(df, vary: str, path: str, title: str) -> None:
  """act_rms vs the varied size at the first, middle and last block, one line per step."""
  positions = {'first block': lambda n: 1, 'middle block': lambda n: (n + 1) // 2,
               'last block': lambda n: n}
  fig = Figure(figsize=(13, 4))
  axes = fig.subplots(1, 3, sharey=True)
  for ax, (name, pick) in zip(axes, positions.items()):
    sel = df[df.layer == df.num_layers.map(pick)]
    for step, g in sel.groupby('step'):
      g = g.sort_values('value')
      ax.plot(g.value, g.act_rms, marker='o', label=f't={step}',
              color=matplotlib.colormaps['viridis'](step / max(df.step.max(), 1)))
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel(vary)
    ax.set_title(name)
  axes[0].set_ylabel('act_rms of the stream leaving the block')
  axes[-1].legend(fontsize=7, ncol=2)
  fig.suptitle(title)
  fig.tight_layout()
  plots.save(fig, path, dpi=100)


def coord_check(cfg, vary: str, values: list[int], steps: int, out: str):
  """Runs the sweep, writes the CSV and the PNG under out (a local path or a bucket URL);
  returns the DataFrame."""
  storage.check_bucket(out, '--out')
  storage.makedirs(out)
  rows = []
  for v in values:
    c = rung_config(cfg, vary, v)
    validate(c)
    for r in run_rung(c, steps):
      rows.append({'rung': f'{vary}{v}', 'value': v, 'num_layers': c.model.num_layers, **r})
    print(f'{vary}={v}: loss {rows[-1]["loss"]:.4f}', flush=True)
  df = pd.DataFrame(rows)
  storage.write_text(storage.join(out, 'coord_check.csv'),
                     df.drop(columns='num_layers').to_csv(index=False))
  m = cfg.model
  plot(df, vary, storage.join(out, 'coord_check.png'),
       f'{m.parametrization} (init {m.init}, lr {cfg.optim.lr:g}), vary {vary}')
  return df


def main(argv: list[str]) -> None:
  if len(argv) > 1 or not _OUT.value or _CONFIG.value is None:
    print('error: usage: --config=FILE.py --vary=d_model|num_layers --out=DIR', file=sys.stderr)
    sys.exit(2)
  cfg = _CONFIG.value
  base = cfg.model[_VARY.value]
  values = [int(v) for v in _VALUES.value] if _VALUES.value else [base * k for k in (1, 2, 4, 8)]
  try:
    coord_check(cfg, _VARY.value, values, _STEPS.value, _OUT.value)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
