"""Muon (Jordan et al. 2024) for the matrices: optax.contrib's momentum orthogonalized by
Newton-Schulz, then scaled to a fixed update RMS (Liu et al. 2025, arXiv 2502.16982) so
that it shares AdamW's learning rate, as in OSP (Park et al. 2025, arXiv 2506.19697).

Each 2-D matrix is orthogonalized on its own: the layer axis of the scanned stack and the
axis stacking K and V (kv) or SwiGLU's gate and up (wi) are batch axes, never part of the
matrix.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from depthscale.model import param_tree

# Axis (after the layer axis) that stacks separate matrices in one parameter when the
# per-layer rank is >= 3: kv (D, 2, K, E) holds W_K and W_V, SwiGLU's wi (D, 2, F) W_gate, W_up.
STACK_AXIS = {'kv': 1, 'wi': 1}


def dimension_numbers(path, leaf) -> MuonDimensionNumbers:
  """Fan-in (reduction) and output axes of the matrices in a leaf; every other axis is a
  batch axis: the layer axis under 'blocks' and a stacking axis (STACK_AXIS)."""
  lead = 1 if param_tree.in_blocks(path) else 0
  name = param_tree.block_matrix(path)
  n_in = param_tree.FAN_IN_DIMS.get(name, 1)
  reduction = tuple(range(lead, lead + n_in))
  stack = STACK_AXIS.get(name) if param_tree.per_layer_rank(path, leaf) >= 3 else None
  batch = set(range(lead)) | ({lead + stack} if stack is not None else set())
  output = tuple(a for a in range(leaf.ndim) if a not in batch and a not in reduction)
  return MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)


def _dimension_tree(updates):
  return jax.tree_util.tree_map_with_path(dimension_numbers, updates)


def scale_to_rms(rms: float) -> optax.GradientTransformation:
  """Scales each orthogonalized matrix by rms * sqrt(max(fan_in, fan_out)): update RMS ~ rms."""

  def update_fn(updates, state, params=None):
    del params

    def scale(path, u):
      dims = dimension_numbers(path, u)
      fan_in = math.prod(u.shape[a] for a in dims.reduction_axis)
      fan_out = math.prod(u.shape[a] for a in dims.output_axis)
      return u * jnp.asarray(rms * math.sqrt(max(fan_in, fan_out)), u.dtype)
    return jax.tree_util.tree_map_with_path(scale, updates), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def muon(o) -> optax.GradientTransformation:
  """Muon with the optim section's momentum beta, Newton-Schulz steps and update RMS
  (optax's quintic coefficients, Frobenius pre-scaling, Nesterov momentum)."""
  return optax.chain(
      scale_by_muon(ns_steps=o.muon_ns_steps, beta=o.muon_beta,
                    weight_dimension_numbers=_dimension_tree),
      scale_to_rms(o.muon_rms))
