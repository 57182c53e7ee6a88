"""Block-assembly table: how a block wires its sublayers, norms and residual.

A placement maps (x, sublayer) -> x for one sublayer (attention or MLP). New methods
add an entry to PLACEMENTS; the block itself (depthscale.model.Block) never changes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sublayer:
  """What a placement sees of one sublayer."""
  name: str  # 'attn' or 'mlp'
  branch: Callable[[jax.Array], jax.Array]  # F: the attention or MLP function
  norm: Callable[[str], Callable[[jax.Array], jax.Array]]  # norm(role) -> a norm module
  layer: dict  # this block's per-layer scan inputs (1-based 'index', flags, constants)


@dataclasses.dataclass(frozen=True)
class Placement:
  """One entry of the table: the per-sublayer rule and whether a final norm follows."""
  sublayer: Callable[[jax.Array, Sublayer], jax.Array]
  final_norm: bool


def pre_ln(x, s: Sublayer):
  """Pre-LN (Xiong et al. 2020): x + F(Norm(x))."""
  return x + s.branch(s.norm('in')(x))


def post_ln(x, s: Sublayer):
  """Post-LN (Vaswani et al. 2017): Norm(x + F(x)); the output is already normalized."""
  return s.norm('in')(x + s.branch(x))


PLACEMENTS: dict[str, Placement] = {
    'pre_ln': Placement(pre_ln, final_norm=True),
    'post_ln': Placement(post_ln, final_norm=False),
}


def layer_schedule(cfg) -> dict[str, jax.Array]:
  """Per-layer inputs of the scan, each of length L: the 1-based block index (and
  the flags and constants of depth-dependent methods)."""
  return {'index': jnp.arange(1, cfg.num_layers + 1, dtype=jnp.int32)}
