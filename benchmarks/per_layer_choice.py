"""The cost of a per-layer choice of wiring: Mix-LN (Post-LN in the first blocks, Pre-LN in
the rest) beside Pre-LN and Post-LN, as the placement table runs it (a conditional on the
layer's flag: only the chosen wiring runs) and, for comparison, as a select between both
wirings computed every layer (`jnp.where` on the flag: both run, forward and backward).

Train steps are compiled once each and timed interleaved (round-robin), so machine load
affects every variant alike; the median step time and the compile time are printed.

  python benchmarks/per_layer_choice.py [--layers 16] [--d_model 64] [--unroll 16,0] [--rounds 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from depthscale import data  # pylint: disable=wrong-import-position
from depthscale.config import default_config  # pylint: disable=wrong-import-position
from depthscale.model import placements  # pylint: disable=wrong-import-position
from depthscale.model.transformer import make_model  # pylint: disable=wrong-import-position
from depthscale.training.optim import make_optimizer, schedule  # pylint: disable=wrong-import-position
from depthscale.training.steps import init_state, make_train_step  # pylint: disable=wrong-import-position


def select_both(x, s: placements.Sublayer):
  """Mix-LN as a select between the two wirings: both are computed in every layer."""
  post = s.layer['post']
  y = jnp.where(post, s.gate(x), x) + s.branch(jnp.where(post, x, s.norm('in')(x) * s.layer['ln_scale'].astype(x.dtype)))
  return jnp.where(post, s.norm('in')(y), s.gate(y))


placements.PLACEMENTS['mix_ln_select'] = dataclasses.replace(  # the same flags, no conditional
    placements.PLACEMENTS['mix_ln'], sublayer=select_both, first_blocks=None)


def compiled_step(block: str, layers: int, d_model: int, unroll: int):
  """(compiled train step, state, batch, compile seconds) of one variant."""
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = layers, d_model, 2
  c.model.block, c.model.unroll_max_layers = block, unroll
  c.data.seq_len, c.data.batch_size = 64, 16
  model, tx = make_model(c), make_optimizer(c)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, 0, c.data.seq_len)
  batch = next(data.train_iterator(c.data, 0))
  t0 = time.perf_counter()
  step = jax.jit(make_train_step(model, tx, schedule(c), c)).lower(state, batch).compile()
  return step, state, batch, time.perf_counter() - t0


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--layers', type=int, default=16)
  p.add_argument('--d_model', type=int, default=64)
  p.add_argument('--unroll', default='16,0', help='model.unroll_max_layers values (0: rolled)')
  p.add_argument('--rounds', type=int, default=8)
  a = p.parse_args()
  for unroll in map(int, a.unroll.split(',')):
    variants = {b: compiled_step(b, a.layers, a.d_model, unroll)
                for b in ('pre_ln', 'post_ln', 'mix_ln', 'mix_ln_select')}
    times = {b: [] for b in variants}
    for _ in range(a.rounds + 1):  # the first round warms up
      for b, (step, state, batch, _) in variants.items():
        t0 = time.perf_counter()
        jax.block_until_ready(step(state, batch))
        times[b].append(time.perf_counter() - t0)
    scan = 'unrolled' if a.layers <= unroll else 'rolled'
    base = np.median(times['pre_ln'][1:])
    for b, (_, _, _, compile_s) in variants.items():
      ms = np.median(times[b][1:])
      print(f'L{a.layers} d{a.d_model} {scan:>8} {b:<14} step {1e3 * ms:7.1f} ms '
            f'({ms / base:.2f}x pre_ln)  compile {compile_s:5.1f} s', flush=True)


if __name__ == '__main__':
  main()
