"""Cost of the per-layer metrics at L=64: plain step vs instrumented (logging) step, side by side.

  PYTHONPATH=. python benchmarks/metrics_overhead.py [--layers=64 --d_model=64 --seq_len=64
      --batch=4 --repeats=10]

Prints the median step times, their ratio (target: instrumented <= 1.10 x plain), that the
plain step lowers to the same program whether or not metrics are configured, and the
analysis time with its compile count (one compile, whatever L).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from depthscale.config import default_config
from depthscale.model.transformer import make_model
from depthscale.training.analysis import Analyzer
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step


def _config(args):
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = args.layers, args.d_model, 2
  c.data.seq_len, c.data.batch_size = args.seq_len, args.batch
  return c


def _fingerprint(step, state, batch) -> str:
  return hashlib.sha256(jax.jit(step).lower(state, batch).as_text().encode()).hexdigest()[:16]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--layers', type=int, default=64)
  p.add_argument('--d_model', type=int, default=64)
  p.add_argument('--seq_len', type=int, default=64)
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--repeats', type=int, default=10)
  args = p.parse_args()
  cfg = _config(args)
  tx, lr = make_optimizer(cfg), schedule(cfg)
  model = make_model(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, 0, cfg.data.seq_len)
  tokens = jax.random.randint(jax.random.PRNGKey(0), (args.batch, args.seq_len + 1), 0, 256)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': jnp.ones((args.batch, args.seq_len), jnp.float32)}

  plain = jax.jit(make_train_step(model, tx, lr))
  stats = jax.jit(make_train_step(make_model(cfg, collect_stats=True), tx, lr))
  off = cfg.copy_and_resolve_references()
  off.metrics.analysis_every, off.metrics.images = 0, False
  same = _fingerprint(make_train_step(model, tx, lr), state, batch) == _fingerprint(
      make_train_step(make_model(off), tx, lr), state, batch)

  times = {'plain': [], 'instrumented': []}
  for fn in (plain, stats):  # compile and warm up
    jax.block_until_ready(fn(state, batch))
  for _ in range(args.repeats):  # interleaved so that machine load hits both alike
    for name, fn in (('plain', plain), ('instrumented', stats)):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(state, batch))
      times[name].append(time.perf_counter() - t0)
  med = {k: float(np.median(v)) for k, v in times.items()}

  analyzer = Analyzer(model, jax.device_get(state['params']['blocks']), batch, 0)
  t0 = time.perf_counter()
  analyzer(state['params'])
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  analyzer(state['params'])
  second = time.perf_counter() - t0

  print(f'L={args.layers} d_model={args.d_model} seq_len={args.seq_len} batch={args.batch} '
        f'backend={jax.default_backend()} repeats={args.repeats}')
  print(f'plain step         {1e3 * med["plain"]:9.1f} ms')
  print(f'instrumented step  {1e3 * med["instrumented"]:9.1f} ms')
  print(f'ratio instrumented/plain = {med["instrumented"] / med["plain"]:.3f} (target <= 1.10)')
  print(f'plain step program identical with metrics off: {same}')
  print(f'analysis: first call (compile + run) {first:.1f} s, second call {second:.2f} s '
        f'= {second / med["plain"]:.1f} plain steps; compiles: {analyzer.fn._cache_size()}')


if __name__ == '__main__':
  main()
