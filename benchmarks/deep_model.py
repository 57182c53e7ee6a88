"""The deep, narrow model of the compile-time and memory benchmarks, and the workers that
each measure one quantity in a fresh process (clean compile caches and max RSS).

  python -m benchmarks.deep_model compile scan 1024   (the default: unrolled up to 16 layers)
  python -m benchmarks.deep_model compile rolled 8    (scan rolled whatever the depth)
  python -m benchmarks.deep_model compile unrolled 8  (Python loop over layers)
  python -m benchmarks.deep_model memory nothing_saveable 1024
"""

from __future__ import annotations

import json
import resource
import sys
import time

import jax
import numpy as np
import optax

from depthscale.config import default_config
from depthscale.model.transformer import apply_unrolled, make_model
from depthscale.training import host_memory
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step, weighted_loss

D_MODEL, HEADS = 64, 2


def deep_config(layers: int, remat: str = 'none', seq_len: int = 128, batch: int = 2):
  """d_model 64, 2 heads, the given depth and remat policy."""
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.remat = layers, D_MODEL, HEADS, remat
  c.data.seq_len, c.data.batch_size = seq_len, batch
  return c


def unrolled_train_step(model, tx):
  """The naive reference: the same loss and update with a Python loop over layers."""

  def step(state, batch):
    loss, grads = jax.value_and_grad(
        lambda p: weighted_loss(apply_unrolled(model, p, batch['inputs']), batch))(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    return {**state, 'params': optax.apply_updates(state['params'], updates),
            'opt_state': opt_state}, loss

  return step


def _setup(cfg):
  model, tx = make_model(cfg), make_optimizer(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, 0, cfg.data.seq_len)
  shape = (cfg.data.batch_size, cfg.data.seq_len)
  tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, shape, dtype=np.int32)
  batch = {'inputs': tokens, 'targets': tokens, 'weights': np.ones(shape, np.float32)}
  return model, tx, state, batch


def compile_seconds(kind: str, layers: int) -> dict:
  """Seconds to trace, lower and compile one train step: 'scan' (model.unroll_max_layers as
  configured by default), 'rolled' (a rolled scan at any depth) or 'unrolled' (Python loop)."""
  cfg = deep_config(layers)
  if kind == 'rolled':
    cfg.model.unroll_max_layers = 0
  model, tx, state, batch = _setup(cfg)
  fn = unrolled_train_step(model, tx) if kind == 'unrolled' else make_train_step(model, tx, schedule(cfg))
  t0 = time.perf_counter()
  jax.jit(fn, donate_argnums=0).lower(state, batch).compile()
  return {'compile_s': time.perf_counter() - t0}


def peak_rss(remat: str, layers: int) -> dict:
  """Max RSS (MiB) of a process that compiles and runs two train steps, host memory handled
  as the trainer does (freed memory kept once the step is compiled)."""
  cfg = deep_config(layers, remat)
  model, tx, state, batch = _setup(cfg)
  step = jax.jit(make_train_step(model, tx, schedule(cfg)), donate_argnums=0).lower(state, batch).compile()
  host_memory.keep_freed_memory()
  for _ in range(2):
    state, out = step(state, batch)
  jax.block_until_ready(out)
  return {'max_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          'loss': float(out['loss'])}


if __name__ == '__main__':
  what, kind, depth = sys.argv[1], sys.argv[2], int(sys.argv[3])
  result = compile_seconds(kind, depth) if what == 'compile' else peak_rss(kind, depth)
  print(json.dumps(result))
