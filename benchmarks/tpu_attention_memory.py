"""Per-chip TPU memory of causal attention, forward and backward: the Pallas splash kernel
(depthscale's TPU default) against XLA's full masked composition, compiled ahead of time
for a TPU slice on this host (no TPU needed; `pip install -e ".[tpu]"`).

  python benchmarks/tpu_attention_memory.py [--topology=v5p-8] [--seq_lens=2048,8192]
      [--batch=4] [--heads=8] [--kv_heads=8] [--head_dim=128]

Each program is jit(value_and_grad(sum(attention(q, k, v)))) in bf16, batch sharded over
the slice's chips; the table gives memory_analysis() per chip (depthscale.training.dryrun.memory).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=wrong-import-position
from depthscale.model import ops  # pylint: disable=wrong-import-position
from depthscale.training import dryrun, topology  # pylint: disable=wrong-import-position

KERNELS = ('splash', 'xla')
MIB = 2 ** 20


def compile_attention(kernel: str, mesh, shape_q, shape_kv):
  """The compiled forward-and-backward attention program for `mesh`, and its compile time."""
  spec = NamedSharding(mesh, PartitionSpec('data'))
  loss = lambda q, k, v: jnp.sum(ops.attention(q, k, v, None, kernel).astype(jnp.float32))
  step = jax.jit(jax.value_and_grad(loss, (0, 1, 2)), in_shardings=(spec,) * 3)
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=spec) for s in (shape_q, shape_kv, shape_kv)]
  start = time.perf_counter()
  with jax.set_mesh(mesh), nn.logical_axis_rules((('batch', 'data'),)):
    compiled = step.lower(*args).compile()
  return compiled, time.perf_counter() - start


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--topology', default='v5p-8')
  p.add_argument('--seq_lens', default='2048,8192')
  p.add_argument('--batch', type=int, default=4)
  p.add_argument('--heads', type=int, default=8)
  p.add_argument('--kv_heads', type=int, default=8)
  p.add_argument('--head_dim', type=int, default=128)
  a = p.parse_args()
  if not topology.has_libtpu():
    sys.exit(f'the TPU compiler (libtpu) is not installed: {topology.INSTALL_HINT}')
  s = topology.parse(a.topology)
  devices = topology.devices(s)
  mesh = jax.sharding.Mesh(devices, ('data',))
  rows = []
  for t in (int(x) for x in a.seq_lens.split(',')):
    for kernel in KERNELS:
      compiled, seconds = compile_attention(kernel, mesh, (a.batch, t, a.heads, a.head_dim),
                                            (a.batch, t, a.kv_heads, a.head_dim))
      m = dryrun.memory(compiled)
      rows.append([t, kernel, 'tpu_custom_call' in compiled.as_text(), m['argument'] / MIB,
                   m['output'] / MIB, m['temp'] / MIB, seconds])
      print(rows[-1], flush=True)
  print(f'\n{a.topology} ({len(devices)} chips), B {a.batch}, H {a.heads}, KV {a.kv_heads}, '
        f'E {a.head_dim}, bf16, forward + backward; MiB per chip')
  print(common.table(['T', 'kernel', 'Mosaic kernel', 'arguments', 'outputs', 'temporaries',
                      'compile s'], rows))


if __name__ == '__main__':
  main()
