"""Compile targets by name: TPU slices ('v5p-64', 'v5e-256', 'v4-128', 'v6e-16') and GPU nodes
('h100-8', 'h200-8', 'a100-80g-8', 'b200-8'; depthscale.training.gpus), their chips'
published figures, and compile-only devices of a target for ahead-of-time compilation on
any host.

A TPU name's suffix counts TensorCores on v4 and v5p (two per chip, one JAX device per chip)
and chips on v5e and v6e, as in Cloud TPU accelerator types; a GPU name's counts the GPUs of
one node (8).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from typing import Callable

import jax
from jax.experimental import topologies

from depthscale.errors import ConfigError
from depthscale.training import gpus


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
  """A TPU slice (generation, chip count, its topology string 'v5p:2x4x4', slices over DCN)
  or GPU nodes (model, GPU count, 'h100:2x8' for 2 nodes of 8)."""
  name: str
  generation: str
  chips: int
  bounds: tuple[int, ...]
  num_slices: int = 1

  @property
  def platform(self) -> str:
    return 'gpu' if self.generation in gpus.GPUS else 'tpu'

  @property
  def chip(self) -> Chip | gpus.Gpu:
    return gpus.GPUS[self.generation] if self.platform == 'gpu' else CHIPS[self.generation]

  @property
  def num_nodes(self) -> int:
    """GPU nodes (1 for a TPU slice)."""
    return self.bounds[0] if self.platform == 'gpu' else 1

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


def parse(name: str, num_slices: int = 1, num_nodes: int = 1) -> Slice:
  """'v5p-64' -> Slice(v5p, 32 chips, (2, 4, 4)); 'h100-8' with num_nodes=2 -> Slice(h100, 16
  GPUs, (2, 8)); ConfigError for an unknown name or a count that does not apply to it."""
  allowed = (f'GEN-N with GEN in {", ".join(CHIPS)} and N a power of two (TensorCores on '
             'v4 / v5p, at least 8; chips on v5e / v6e), e.g. v5p-64, v5e-256, v4-128, v6e-16; '
             f'or a node of {gpus.GPUS_PER_NODE} GPUs: '
             + ', '.join(f'{g}-{gpus.GPUS_PER_NODE}' for g in gpus.GPUS))
  for count, value in (('num_slices', num_slices), ('num_nodes', num_nodes)):
    if not isinstance(value, int) or value < 1:
      raise ConfigError(f'--{count}={value!r} is invalid: allowed a positive int')
  gpu = re.fullmatch(rf'({"|".join(gpus.GPUS)})-{gpus.GPUS_PER_NODE}', name or '')
  if gpu:
    if num_slices != 1:
      raise ConfigError(f'--num_slices={num_slices} is invalid for --topology={name}: '
                        'allowed 1 (GPU nodes are counted by --num_nodes)')
    return Slice(name, gpu.group(1), gpus.GPUS_PER_NODE * num_nodes,
                 (num_nodes, gpus.GPUS_PER_NODE))
  m = re.fullmatch(r'(v\d+[a-z]?)-(\d+)', name or '')
  if not m or m.group(1) not in CHIPS:
    raise ConfigError(f'--topology={name!r} is invalid: allowed {allowed}')
  if num_nodes != 1:
    raise ConfigError(f'--num_nodes={num_nodes} is invalid for --topology={name}: allowed 1 '
                      '(TPU slices are joined by --num_slices)')
  gen, n = m.group(1), int(m.group(2))
  chip = CHIPS[gen]
  chips = n // chip.cores_per_chip
  smallest = 4 if chip.torus_dims == 3 else 1
  if n % chip.cores_per_chip or chips < smallest or chips & (chips - 1):
    raise ConfigError(f'--topology={name!r} is invalid: allowed {allowed}')
  return Slice(name, gen, chips, chip_bounds(chips, chip.torus_dims), num_slices)


MAX_DOUBLINGS = 4  # the smallest-slice search looks at most 16 times the chips of its start


def resized(s: Slice, factor: float) -> Slice | None:
  """The TPU slice of s's generation with `factor` times its chips (as many slices over
  DCN), None where that is no slice ('v5p-8' halved, for one)."""
  cores = s.chips * factor * CHIPS[s.generation].cores_per_chip
  if cores != int(cores):
    return None
  try:
    return parse(f'{s.generation}-{int(cores)}', s.num_slices)
  except ConfigError:
    return None


def smallest_fitting(start: Slice, fits_start: bool, fits: Callable[[Slice], bool]) -> str | None:
  """The name of the smallest slice of start's generation on which `fits` holds, searched
  from start (where it holds iff fits_start): halved while it still holds, or doubled (at
  most MAX_DOUBLINGS times) until it does; None where no slice tried fits."""
  if fits_start:
    current = start
    while (smaller := resized(current, 0.5)) is not None and fits(smaller):
      current = smaller
    return current.name
  current = start
  for _ in range(MAX_DOUBLINGS):
    current = resized(current, 2)
    if current is None:
      return None
    if fits(current):
      return current.name
  return None


def has_libtpu() -> bool:
  """Whether the TPU compiler (libtpu) is installed."""
  return importlib.util.find_spec('libtpu') is not None


INSTALL_HINT = f'pip install "jax[tpu]=={jax.__version__}"'


def missing_compiler(name: str) -> str | None:
  """The one-line error where the compiler that target `name` needs is not installed (the
  CUDA plugin for a GPU name, libtpu otherwise), None where it is."""
  if any(name.startswith(f'{g}-') for g in gpus.GPUS):
    return None if gpus.has_cuda_plugin() else (
        f'--topology={name} needs the CUDA compiler (no GPU): {gpus.INSTALL_HINT}')
  return None if has_libtpu() else f'--topology needs the TPU compiler (no TPU): {INSTALL_HINT}'



def devices(s: Slice) -> list:
  """The compile-only devices of the target: a TPU slice's (num_slices copies) from libtpu,
  GPU nodes' from the CUDA plugin; no TPU or GPU needed. Other processes on the host may
  hold libtpu's lock: compiling does not need it."""
  if s.platform == 'gpu':
    return gpus.devices(s.chip, s.num_nodes)
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  kwargs = {'num_slices': s.num_slices} if s.num_slices > 1 else {}
  if s.chips < 4:  # smaller than one host's default 2x2 chips
    kwargs['chips_per_host_bounds'] = list(s.bounds) + [1] * (3 - len(s.bounds))
  return list(topologies.get_topology_desc(topology_name=s.topology, platform='tpu',
                                           **kwargs).devices)
