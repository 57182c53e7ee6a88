"""TPU slices by name ('v5p-64', 'v5e-256', 'v4-128', 'v6e-16'), their chips' published
figures, and compile-only devices of a slice for ahead-of-time compilation on any host.

The name's suffix counts TensorCores on v4 and v5p (two per chip, one JAX device per chip)
and chips on v5e and v6e, as in Cloud TPU accelerator types.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

import jax
from jax.experimental import topologies

from depthscale.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: published per-chip figures (Cloud TPU system architecture pages)."""
  cores_per_chip: int  # TensorCores counted by the accelerator-type suffix
  torus_dims: int  # 3 (v4, v5p) or 2 (v5e, v6e)
  hbm_bytes: float
  peak_bf16_flops: float  # per second
  hbm_bytes_per_s: float


CHIPS = {
    'v4': Chip(2, 3, 32 * 2 ** 30, 275e12, 1228e9),
    'v5e': Chip(1, 2, 16 * 2 ** 30, 197e12, 819e9),
    'v5p': Chip(2, 3, 95e9, 459e12, 2765e9),
    'v6e': Chip(1, 2, 32e9, 918e12, 1640e9),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice: generation, chip count, its topology string ('v5p:2x4x4') and slices."""
  name: str
  generation: str
  chips: int
  bounds: tuple[int, ...]
  num_slices: int = 1

  @property
  def chip(self) -> Chip:
    return CHIPS[self.generation]

  @property
  def topology(self) -> str:
    return f'{self.generation}:' + 'x'.join(map(str, self.bounds))


def chip_bounds(chips: int, dims: int) -> tuple[int, ...]:
  """Cloud TPU's slice shape of a power-of-two chip count: 2x2x1, 2x2x2, 2x2x4, 2x4x4,
  4x4x4, ... (3D torus, from 2x2x1) or 1x1, 1x2, 2x2, 2x4, 4x4, 4x8, ... (2D): doubling
  the smallest axis, the last of equals."""
  bounds = [2, 2, 1] if dims == 3 else [1, 1]
  while math.prod(bounds) < chips:
    bounds[max(range(dims), key=lambda j: (-bounds[j], j))] *= 2
  return tuple(bounds)


def parse(name: str, num_slices: int = 1) -> Slice:
  """'v5p-64' -> Slice(v5p, 32 chips, (2, 4, 4)); ConfigError for an unknown name."""
  allowed = (f'GEN-N with GEN in {", ".join(CHIPS)} and N a power of two (TensorCores on '
             'v4 / v5p, at least 8; chips on v5e / v6e), e.g. v5p-64, v5e-256, v4-128, v6e-16')
  m = re.fullmatch(r'(v\d+[a-z]?)-(\d+)', name or '')
  if not m or m.group(1) not in CHIPS:
    raise ConfigError(f'--topology={name!r} is invalid: allowed {allowed}')
  gen, n = m.group(1), int(m.group(2))
  chip = CHIPS[gen]
  chips = n // chip.cores_per_chip
  smallest = 4 if chip.torus_dims == 3 else 1
  if n % chip.cores_per_chip or chips < smallest or chips & (chips - 1):
    raise ConfigError(f'--topology={name!r} is invalid: allowed {allowed}')
  if num_slices < 1:
    raise ConfigError(f'--num_slices={num_slices!r} is invalid: allowed a positive int')
  return Slice(name, gen, chips, chip_bounds(chips, chip.torus_dims), num_slices)


def has_libtpu() -> bool:
  """Whether the TPU compiler (libtpu) is installed."""
  return importlib.util.find_spec('libtpu') is not None


INSTALL_HINT = f'pip install "jax[tpu]=={jax.__version__}"'


def devices(s: Slice) -> list:
  """The compile-only TPU devices of the slice (num_slices copies), from libtpu; no TPU
  needed. Other processes on the host may hold libtpu's lock: compiling does not need it."""
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  kwargs = {'num_slices': s.num_slices} if s.num_slices > 1 else {}
  if s.chips < 4:  # smaller than one host's default 2x2 chips
    kwargs['chips_per_host_bounds'] = list(s.bounds) + [1] * (3 - len(s.bounds))
  return list(topologies.get_topology_desc(topology_name=s.topology, platform='tpu',
                                           **kwargs).devices)
