"""The periodic analyses' share of a run, estimated for every rung of every experiment file.

  PYTHONPATH=. python benchmarks/metrics_overhead.py --json=/tmp/overhead.json
  PYTHONPATH=. python benchmarks/analysis_share.py --measured=/tmp/overhead.json

Every rung cannot be run on a 2-core host, so the share comes from a cost model fitted to the
measured times of benchmarks/metrics_overhead.py. Per token, a block's forward pass costs
f = 2 N_block + 4 T D FLOPs and the head's h = 2 D V; a train step B T 3 (L f + h); an
analysis on b rows b T (P L f + L h) for the probe scan (P = 2: the statistics forward pass,
which the jvp shares, and the jvp's transposed backward) and the logit lens, b T K (L f + h)
for the K skip passes, and sum 4 m^2 n (m <= n) for the SVDs of the erank of K layers'
matrices and activations.
The measured analysis / plain-step ratios fit r = a * passes / step + c * svd / step
(least squares on relative error, a, c >= 0); each rung's r is the fit times (1 + the
fit's largest relative error on the measured points). Share = n r / (steps + n r) for the
n analyses of a run (every metrics.analysis_every steps and at the last), compile excluded;
printed for the rung's own cadence and for the default one (analyses switched on).

With compile: the analysis program's compile C_a (optimized, light or fast, as the rung's
metrics.analysis_compile gives; light and fast run r times their measured ratio to optimized) and
the two train steps' C_t (plain and logging) are measured per depth and interpolated in
log L (clamped to the measured range);
a step takes its FLOPs at the fastest measured rate (FLOPs / plain step time), so short
steps come out short and the share high. Share with compile =
(C_a + n r s) / (C_t + C_a + steps s + n r s) at the rung's own cadence. Still excluded:
eval, checkpoints, logging and start-up, which only add to a real run's wall time.
"""

from __future__ import annotations

import argparse
import glob
import json
import math

import jax
import numpy as np
from scipy.optimize import nnls

from benchmarks.common import table
from benchmarks.metrics_overhead import config
from depthscale import experiment
from depthscale.config import default_config
from depthscale.model.transformer import make_model
from depthscale.training.analysis import (PROBE_PASSES, analysed_layers, analysis_count,
                                          compile_mode)
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state


def _matrices(cfg) -> list[tuple[int, ...]]:
  """Per-layer shapes of the block's matrices (leaves with a layer axis and >= 2 more)."""
  state = jax.eval_shape(lambda: init_state(make_model(cfg), make_optimizer(cfg), 0, cfg.data.seq_len))
  return [w.shape[1:] for w in jax.tree.leaves(state['params']['blocks']) if len(w.shape) >= 3]


def _svd_flops(m: int, n: int) -> float:
  m, n = min(m, n), max(m, n)
  return 4.0 * m * m * n


def costs(cfg) -> dict[str, float]:
  """FLOP counts of one train step, the analysis's passes and its SVDs (see the docstring)."""
  m, d = cfg.model, cfg.model.d_model
  mats = _matrices(cfg)
  n_block = sum(math.prod(s) for s in mats)
  f = 2 * n_block + 4 * cfg.data.seq_len * d
  h = 2 * d * m.vocab_size
  big, rows = cfg.data.batch_size * cfg.data.seq_len, cfg.metrics.analysis_batch_size * cfg.data.seq_len
  k, l = len(analysed_layers(cfg)), m.num_layers
  as_matrix = lambda s: (d, math.prod(s[1:])) if s[0] == d else (math.prod(s[:-1]), s[-1])
  svd = k * (sum(_svd_flops(*as_matrix(s)) for s in mats) + _svd_flops(rows, d))
  return {'step': 3.0 * big * (l * f + h), 'params': l * n_block,
          'passes': rows * (PROBE_PASSES * l * f + l * h + k * (l * f + h)), 'svd': svd}


def fit(measured: dict, d_model: int, heads: int, seq_len: int, batch: int):
  """(a, c, largest relative error) of r = a passes/step + c svd/step on the measured points."""
  xs, ys = [], []
  for layers, m in measured.items():
    for name, n in (('analysis', None), ('full', 0)):
      if f'{name}_s' in m:
        cfg = config(int(layers), d_model, heads, seq_len, batch)
        if n is not None:
          cfg.metrics.analysis_layers = n
        c = costs(cfg)
        xs.append([c['passes'] / c['step'], c['svd'] / c['step']])
        ys.append(m[f'{name}_s'] / m['plain_s'])
  x, y = np.asarray(xs), np.asarray(ys)
  coef, _ = nnls(x / y[:, None], np.ones(len(y)))  # relative residuals
  err = np.abs(x @ coef / y - 1)
  return coef[0], coef[1], float(err.max()), list(zip(y, x @ coef))


def compile_model(measured: dict, d_model: int, heads: int, seq_len: int, batch: int):
  """(key -> (L -> measured value), step FLOPs per second): measured values interpolated in
  log L, clamped; the fastest measured step rate."""
  depths = sorted(measured, key=int)
  log_l = np.log([int(l) for l in depths])
  at = lambda key: lambda l: float(np.interp(np.log(l), log_l, [measured[d][key] for d in depths]))
  rate = max(costs(config(int(l), d_model, heads, seq_len, batch))['step'] / measured[l]['plain_s']
             for l in depths)
  return at, rate


def rungs():
  """(file, arg, rung, config) of every experiment file, its size arguments included."""
  for path in sorted(glob.glob('experiments/*.py')):
    module = experiment.load_module(path)
    for arg in [None] + list(getattr(module, 'SIZES', {})):
      for r, cfg in experiment.resolve(path + (f':{arg}' if arg else ''), check_machine=False):
        yield path.split('/')[-1], arg or '', r.name, cfg


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--measured', required=True, help='JSON written by metrics_overhead.py --json')
  p.add_argument('--d_model', type=int, default=64)
  p.add_argument('--heads', type=int, default=2)
  p.add_argument('--seq_len', type=int, default=32)
  p.add_argument('--batch', type=int, default=16)
  args = p.parse_args()
  with open(args.measured) as f:
    measured = json.load(f)
  a, c, err, points = fit(measured, args.d_model, args.heads, args.seq_len, args.batch)
  print(f'fit: a = {a:.3g}, c = {c:.3g}; measured vs fitted r: ' +
        ', '.join(f'{y:.2f} / {z:.2f}' for y, z in points) + f'; margin x{1 + err:.2f}')
  at, rate = compile_model(measured, args.d_model, args.heads, args.seq_len, args.batch)
  every = default_config().metrics.analysis_every
  rows, seen = [], set()
  for name, arg, _, cfg in rungs():
    m = cfg.model
    key = (name, arg, m.num_layers, m.d_model, cfg.data.seq_len, cfg.data.batch_size,
           cfg.train.steps, cfg.metrics.analysis_every)
    if key in seen:
      continue
    seen.add(key)
    k = costs(cfg)
    r = (a * k['passes'] + c * k['svd']) / k['step'] * (1 + err)
    own = cfg.metrics.analysis_every
    share = lambda e: analysis_count(cfg.train.steps, e) * r / (
        cfg.train.steps + analysis_count(cfg.train.steps, e) * r)
    l, mode = m.num_layers, compile_mode(cfg, k['params'])
    kind = 'analysis' if mode == 'optimized' else mode
    step_s, ca = k['step'] / rate, at(f'{kind}_compile_s')(l)
    slower = at(f'{kind}_s')(l) / at('analysis_s')(l)
    runs_s = analysis_count(cfg.train.steps, own) * r * slower * step_s
    c_train = at('plain_compile_s')(l) + at('instrumented_compile_s')(l)
    with_compile = (ca + runs_s) / (c_train + ca + cfg.train.steps * step_s + runs_s)
    rows.append([name, arg, m.num_layers, m.d_model, cfg.data.seq_len, cfg.data.batch_size,
                 cfg.train.steps, own, r, f'{100 * share(own):.1f}%' if own else '-',
                 f'{100 * share(every):.1f}%', f'{100 * with_compile:.1f}%' if own else '-', mode if own else '-'])
  print(table(['file', 'arg', 'L', 'D', 'T', 'B', 'steps', 'every', 'r (steps)', 'share',
               f'share @{every}', 'with compile', 'compiled'], rows))


if __name__ == '__main__':
  main()
