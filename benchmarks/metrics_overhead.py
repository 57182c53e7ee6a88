"""Cost of the per-layer metrics and of the periodic analyses, by depth.

  PYTHONPATH=. python benchmarks/metrics_overhead.py [--layers=16,256,1024 --d_model=64
      --seq_len=32 --batch=16 --repeats=3 --full_max_layers=1024 --steps=200]

Per depth, with the trainer's compiled programs (`Plan.compile`): the median plain and
instrumented (logging) step, their ratio (target: instrumented <= 1.10 x plain), that the
plain step lowers to the same program whether or not metrics are configured, and the
analysis at the default `metrics.analysis_layers` (also compiled as 'light' and 'fast': LLVM
level 1 and 0 with XLA's loop emitters, ops.REDUCED_LEVEL_OPTIONS) and
with every layer (0, up to --full_max_layers): compile time (the train steps' too, in
--json), run time, run time in plain steps, and its share of a run of --steps steps at the
default cadence (`metrics.analysis_every`, plus the last step): share = analyses x analysis
/ (steps x plain step + analyses x analysis), compile excluded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import table
from depthscale.config import default_config
from depthscale.model import ops
from depthscale.model.transformer import make_model
from depthscale.training import sharding
from depthscale.training.analysis import Analyzer, analysed_layers, analysis_count
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step


def share(steps: int, every: int, step_s: float, analysis_s: float) -> float:
  """The analyses' share of a run's steps-plus-analyses time."""
  n = analysis_count(steps, every)
  return n * analysis_s / (steps * step_s + n * analysis_s)


def _fingerprint(step, state, batch) -> str:
  return hashlib.sha256(jax.jit(step).lower(state, batch).as_text().encode()).hexdigest()[:16]


def _timed(fn) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def measure(cfg, repeats: int, full: bool) -> dict:
  """Step and analysis times (seconds) of cfg's model on a random batch, as the trainer
  compiles them; the analysis on the first metrics.analysis_batch_size rows."""
  model, tx, lr = make_model(cfg), make_optimizer(cfg), schedule(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = plan.init(init_state, model, tx, 0, cfg.data.seq_len)
  b, t = cfg.data.batch_size, cfg.data.seq_len
  tokens = jax.random.randint(jax.random.PRNGKey(0), (b, t + 1), 0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'weights': jnp.ones((b, t), jnp.float32)}
  init_blocks = jax.tree.map(lambda x: x.copy(), state['params']['blocks'])
  steps, compiled = {}, {}
  for name, m in (('plain', model), ('instrumented', make_model(cfg, collect_stats=True))):
    t0 = time.perf_counter()
    steps[name] = plan.compile_train_step(make_train_step(m, tx, lr, cfg), state, batch)
    compiled[f'{name}_compile_s'] = time.perf_counter() - t0
  times = {k: [] for k in steps}
  for i in range(repeats + 1):  # the first round warms up; interleaved so load hits both alike
    for name, fn in steps.items():
      t0 = time.perf_counter()
      state, out = fn(state, batch, plan.scalar(cfg.optim.lr))
      jax.block_until_ready(out)
      if i:
        times[name].append(time.perf_counter() - t0)
  out = {**compiled, **{f'{k}_s': float(np.median(v)) for k, v in times.items()}}
  rows = cfg.metrics.analysis_batch_size
  sampled = analysed_layers(cfg)
  for name, layers, mode in (('analysis', sampled, 'optimized'), ('light', sampled, 'light'),
                             ('fast', sampled, 'fast')) + ((('full', None, 'optimized'),) if full else ()):
    t0 = time.perf_counter()
    analyzer = Analyzer(model, plan, init_blocks, batch, rows, 0, cfg, layers,
                        ops.CPU_OPT_LEVELS[mode])
    out[f'{name}_compile_s'] = time.perf_counter() - t0
    runs = [_timed(lambda: analyzer(state['params'])) for _ in range(1 if name == 'full' else 2)]
    out[f'{name}_s'] = float(np.median(runs))
    out[f'{name}_layers'] = len(layers) if layers else cfg.model.num_layers
  return out


def config(layers: int, d_model: int, heads: int, seq_len: int, batch: int):
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = layers, d_model, heads
  c.data.seq_len, c.data.batch_size = seq_len, batch
  return c


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--layers', default='16,256,1024')
  p.add_argument('--d_model', type=int, default=64)
  p.add_argument('--heads', type=int, default=2)
  p.add_argument('--seq_len', type=int, default=32)
  p.add_argument('--batch', type=int, default=16)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--full_max_layers', type=int, default=1024, help='time the full analysis up to this depth')
  p.add_argument('--steps', type=int, default=200, help='run length of the share column')
  p.add_argument('--json', default='', help='also write the measurements to this file')
  args = p.parse_args()
  every = default_config().metrics.analysis_every
  rows, results = [], {}
  for layers in map(int, args.layers.split(',')):
    cfg = config(layers, args.d_model, args.heads, args.seq_len, args.batch)
    m = measure(cfg, args.repeats, layers <= args.full_max_layers)
    results[layers] = m
    print(f'L={layers}: ' + json.dumps({k: round(v, 4) for k, v in m.items()}), flush=True)
    for name in ('analysis', 'light', 'fast', 'full'):
      if f'{name}_s' in m:
        rows.append([layers, f"{m[f'{name}_layers']}{' ' + name if name in ('light', 'fast') else ''}", 1e3 * m['plain_s'], m['instrumented_s'] / m['plain_s'],
                     m[f'{name}_compile_s'], m[f'{name}_s'], m[f'{name}_s'] / m['plain_s'],
                     f'{100 * share(args.steps, every, m["plain_s"], m[f"{name}_s"]):.1f}%'])
  cfg = config(64, args.d_model, args.heads, args.seq_len, args.batch)
  off = cfg.copy_and_resolve_references()
  off.metrics.analysis_every, off.metrics.images = 0, False
  state = jax.eval_shape(lambda: init_state(make_model(cfg), make_optimizer(cfg), 0, args.seq_len))
  batch = {k: jax.ShapeDtypeStruct((args.batch, args.seq_len), d) for k, d in
           (('inputs', jnp.int32), ('targets', jnp.int32), ('weights', jnp.float32))}
  same = _fingerprint(make_train_step(make_model(cfg), make_optimizer(cfg), schedule(cfg)), state, batch) == \
      _fingerprint(make_train_step(make_model(off), make_optimizer(off), schedule(off)), state, batch)
  print(f'\nd_model={args.d_model} seq_len={args.seq_len} batch={args.batch} analysis rows='
        f'{cfg.metrics.analysis_batch_size} backend={jax.default_backend()} repeats={args.repeats}; '
        f'share: {analysis_count(args.steps, every)} analyses in {args.steps} steps (every {every} '
        'and the last), compile excluded')
  print(table(['L', 'skip layers (light / fast: LLVM level 1 / 0)', 'plain ms', 'instr/plain', 'compile s', 'analysis s',
               'in plain steps', 'share'], rows))
  print(f'plain step program identical with metrics off (L=64): {same}')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f)


if __name__ == '__main__':
  main()
