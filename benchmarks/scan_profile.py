"""Where config D's step goes: the rolled layer scan at 64 layers against the same scan fully
unrolled (interleaved step times, compile times), each step's XLA-CPU thunks by kind from a
profiler trace, and the rates of D's matmuls in XLA against torch.

  python benchmarks/scan_profile.py [--config D] [--pairs 12]

Thunk times are summed over a step's thunks; XLA-CPU runs independent thunks concurrently,
so the sums exceed the step's wall time and each kind's share is of the summed time.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from benchmarks import common  # pylint: disable=wrong-import-position
from depthscale import data  # pylint: disable=wrong-import-position
from depthscale.model import ops  # pylint: disable=wrong-import-position
from depthscale.model.transformer import make_model  # pylint: disable=wrong-import-position
from depthscale.training import host_memory, sharding  # pylint: disable=wrong-import-position
from depthscale.training.optim import make_optimizer, schedule  # pylint: disable=wrong-import-position
from depthscale.training.steps import init_state, make_train_step  # pylint: disable=wrong-import-position

# thunk kind -> pattern on the thunk's name (first match wins)
KINDS = [('matmul (oneDNN / Eigen)', r'onednn|dot|custom-call'),
         ('saved-activation stacks: writes', r'dynamic-update-slice'),
         ('saved-activation stacks: reads', r'dynamic-slice'),
         ('zero fills', r'broadcast'),
         ('copies and transposes', r'copy|transpose'),
         ('reductions', r'reduce'),
         ('elementwise and the rest', r'.')]


def plain_step(name: str, unroll_max_layers: int):
  """The trainer's compiled plain step of config `name`, its state, a batch, compile seconds."""
  cfg = common.nano_config(name, 10, 10)
  cfg.model.unroll_max_layers = unroll_max_layers
  model, tx = make_model(cfg), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = plan.init(init_state, model, tx, 0, cfg.data.seq_len)
  batch = plan.global_batch(next(data.train_iterator(cfg.data, 0)))
  t0 = time.perf_counter()
  step = plan.compile_train_step(make_train_step(model, tx, schedule(cfg), cfg), state, batch)
  lr = plan.scalar(cfg.optim.lr)
  return lambda s, b: step(s, b, lr), state, batch, time.perf_counter() - t0


def timed(step, state, batch):
  t0 = time.perf_counter()
  state, out = step(state, batch)
  jax.block_until_ready(out)
  return state, time.perf_counter() - t0


def thunk_kinds(step, state, batch, steps: int = 3) -> dict[str, float]:
  """ms per step summed over thunks of each kind (KINDS), from a profiler trace."""
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    for _ in range(steps):
      state, _ = timed(step, state, batch)
    jax.profiler.stop_trace()
    path = glob.glob(os.path.join(d, '**', '*.trace.json.gz'), recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)['traceEvents']
  out = collections.Counter()
  for e in events:
    name = e.get('name', '')
    if e.get('ph') != 'X' or name.startswith(('ThunkExecutor', '$', 'Pjit', 'while')):
      continue
    kind = next(k for k, pattern in KINDS if re.search(pattern, name))
    out[kind] += e.get('dur', 0) / 1e3 / steps
  return dict(out)


def _best(fn, repeats: int) -> float:
  """Best seconds of `repeats` calls after a warm-up call."""
  fn()
  return min(common.timed_call(fn) for _ in range(repeats))


def matmul_rates(d: int, rows: int, repeats: int = 20) -> list[list]:
  """GFLOP/s of the block's matmuls (forward, input and weight gradients) at width d."""
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(os.cpu_count() or 1)
  out = []
  for label, (m, k, n), transposed in [('x W_up', (rows, d, 4 * d), False),
                                       ('h W_down', (rows, 4 * d, d), False),
                                       ('dW_down = h^T g', (4 * d, rows, d), True),
                                       ('dW_up = x^T g', (d, rows, 4 * d), True)]:
    a = np.random.randn(*((k, m) if transposed else (m, k))).astype(np.float32)
    b = np.random.randn(k, n).astype(np.float32)
    dims = (((0,), (0,)) if transposed else ((1,), (0,)), ((), ()))
    ja, jb = jax.device_put(a), jax.device_put(b)
    fn = jax.jit(lambda x, y, dims=dims: jax.lax.dot_general(x, y, dims)).lower(ja, jb).compile(
        ops.compiler_options('cpu'))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    tfn = (lambda: ta.t() @ tb) if transposed else (lambda: ta @ tb)
    flops = 2.0 * m * k * n
    out.append([label, f'{m}x{k}x{n}', flops / _best(lambda: fn(ja, jb).block_until_ready(), repeats) / 1e9,
                flops / _best(tfn, repeats) / 1e9])
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--config', default='D')
  p.add_argument('--pairs', type=int, default=12)
  a = p.parse_args()
  d, layers, _, seq_len = common.SHAPES[a.config]
  print(f'load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores', flush=True)
  variants = {'rolled': plain_step(a.config, 0), 'unrolled': plain_step(a.config, layers)}
  host_memory.keep_freed_memory()
  states = {k: v[1] for k, v in variants.items()}
  times = {k: [] for k in variants}
  for i in range(a.pairs + 2):  # A B A B ..., two warm-up pairs
    for k, (step, _, batch, _) in variants.items():
      states[k], t = timed(step, states[k], batch)
      if i >= 2:
        times[k].append(t)
  ratios = [u / r for r, u in zip(times['rolled'], times['unrolled'])]
  print(f'\nconfig {a.config} (d {d}, {layers} layers, T {seq_len}, batch {common.BATCH}): '
        f'{a.pairs} interleaved pairs of plain steps')
  print(common.table(['scan', 'compile s', 'step ms (median)'],
                     [[k, v[3], 1e3 * common.median(times[k])] for k, v in variants.items()]))
  q = np.quantile(ratios, [0.25, 0.5, 0.75])
  print(f'unrolled / rolled step time: {q[1]:.3f} (quartiles {q[0]:.3f}-{q[2]:.3f})')
  kinds = {k: thunk_kinds(v[0], states[k], v[2]) for k, v in variants.items()}
  rows = [[kind, kinds['rolled'].get(kind, 0.0), kinds['unrolled'].get(kind, 0.0)] for kind, _ in KINDS]
  print('\nthunk time by kind, ms per step (summed over concurrent thunks)')
  print(common.table(['kind', 'rolled', 'unrolled'], rows))
  print(f'\nmatmuls of the block at d {d}, {common.BATCH * seq_len} rows, float32, GFLOP/s')
  print(common.table(['matmul', 'MxKxN', 'XLA (train-step options)', 'torch'],
                     matmul_rates(d, common.BATCH * seq_len)))
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  main()
