"""Depth by recurrence: a stack of shared blocks applied model.loops times, optionally relaxed
by a per-loop LoRA on every block matrix (Relaxed Recursive Transformers).

model.num_layers is the effective depth L (what every depth rule, schedule and per-layer
statistic sees); the parameters hold U = L / K unique blocks ([U, ...] stacks, K =
model.loops). Effective block i = k U + u (0-based) applies unique block u in loop k, with
W + B_k,u A_k,u for each matrix W when model.loop_lora_rank r > 0. The LoRA factors live
under the top-level 'loop_lora' with leading axes [K, U]: A (P, r, fan_in), B (P, fan_out, r),
one pair per matrix part (P = 2 for the fused k/v and SwiGLU gate/up, else 1).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.errors import invalid
from depthscale.model import residual
from depthscale.model.param_tree import FAN_IN_DIMS, LOOP_LORA, block_matrix, path_keys
from depthscale.model.placements import PLACEMENTS

# Logical axes of a matrix's fan-in / fan-out side, by matrix name ('heads': heads x head_dim).
_SIDE_AXES = {'q': ('embed', 'heads'), 'kv': ('embed', 'heads'), 'o': ('heads', 'embed'),
              'wi': ('embed', 'mlp'), 'wo': ('mlp', 'embed')}


def unique_layers(cfg) -> int:
  """U = num_layers / loops: the blocks that hold parameters."""
  return cfg.num_layers // cfg.loops


def _parts(name: str, shape) -> int:
  """Matrices stored side by side on axis 1 (k and v; SwiGLU's gate and up) get one LoRA each."""
  return shape[1] if name == 'kv' or (name == 'wi' and len(shape) == 3) else 1


def _sides(name: str, shape) -> tuple[int, int, int]:
  """(fan_in, parts, fan_out) of one block's matrix of shape `shape` (no layer axis)."""
  fan_in, parts = math.prod(shape[:FAN_IN_DIMS[name]]), _parts(name, shape)
  return fan_in, parts, math.prod(shape) // (fan_in * parts)


def _matrix(path) -> tuple[str | None, str]:
  """(matrix name or None, LoRA name) of a leaf at `path` inside one block: ('q', 'attn_q')."""
  keys = path_keys(path)
  return block_matrix(('blocks',) + keys), '_'.join(keys)


class LoopLora(nn.Module):
  """The per-loop LoRA factors of every block matrix: A ~ N(0, 1/fan_in), B = 0, so the
  relaxed model starts as the tied one (standard LoRA init; not the paper's SVD init)."""
  cfg: Any

  @nn.compact
  def __call__(self, blocks) -> dict:
    """blocks: the [U, ...] block parameters (shapes only) -> {LoRA name: (A, B)}."""
    k, r, out = self.cfg.loops, self.cfg.loop_lora_rank, {}

    def declare(path, w):
      name, key = _matrix(path)
      if name is None:
        return
      u, shape = w.shape[0], w.shape[1:]
      fan_in, parts, fan_out = _sides(name, shape)
      # A (r, fan_in) and B (fan_out, r) alike: the rank axis takes the other side's name,
      # so each factor can be cut by both mesh axes of the matrix (FSDP and tensor)
      ax_in, ax_out = _SIDE_AXES[name]
      axes = (None, 'layers', None, ax_out, ax_in)
      a_init = nn.with_logical_partitioning(nn.initializers.normal(fan_in ** -0.5), axes)
      b_init = nn.with_logical_partitioning(nn.initializers.zeros, axes)
      out[key] = (self.param(f'{key}_a', a_init, (k, u, parts, r, fan_in), jnp.float32),
                  self.param(f'{key}_b', b_init, (k, u, parts, fan_out, r), jnp.float32))

    jax.tree_util.tree_map_with_path(declare, blocks)
    return out


def _delta(name: str, shape, a_PxRxI, b_PxOxR) -> jax.Array:
  """B A of each part, laid out as the matrix (fan_in, parts, fan_out) reshaped to `shape`."""
  return jnp.einsum('por,pri->ipo', b_PxOxR, a_PxRxI).reshape(shape)


def merge(block, lora: dict | None):
  """One block's parameters with W + B A on each matrix; lora: {LoRA name: (A, B)} of it."""
  if not lora:
    return block

  def add(path, w):
    name, key = _matrix(path)
    if name is None:
      return w
    a, b = lora[key]
    return w + _delta(name, w.shape, a, b).astype(w.dtype)
  return jax.tree_util.tree_map_with_path(add, block)


def compute_params(cfg, params, non_embedding: int) -> int:
  """The non-embedding parameters a token's forward pass multiplies by (what training FLOPs
  count): the shared blocks once per loop, the LoRA factors (merged into them) not at all."""
  blocks = sum(x.size for x in jax.tree.leaves(params['blocks']))
  lora = sum(x.size for x in jax.tree.leaves(params.get(LOOP_LORA, {})))
  return non_embedding + (cfg.loops - 1) * blocks - lora


def lora_params(params) -> dict | None:
  """{key: (A, B)} with leading [K, U] axes from the model parameters (None without LoRA)."""
  tree = params.get(LOOP_LORA)
  if not tree:
    return None
  return {key[:-2]: (tree[key], tree[key[:-2] + '_b']) for key in tree if key.endswith('_a')}


def effective_blocks(cfg, params):
  """The [L, ...] stack of effective block parameters (unique block u in loop k at k U + u,
  merged with its LoRA): what an untied model of depth L would hold; for references and the
  per-layer analyses, not the training forward (loop_scan never builds it)."""
  blocks, lora = params['blocks'], lora_params(params)
  if cfg.loops == 1:
    return blocks
  loops = []
  for k in range(cfg.loops):
    lora_k = None if lora is None else jax.tree.map(lambda a: a[k], lora)
    loops.append(jax.vmap(merge)(blocks, lora_k) if lora_k else blocks)
  return jax.tree.map(lambda *ls: jnp.concatenate(ls), *loops)


def per_effective_layer(cfg, v_U):
  """A per-unique-block vector (parameter statistics) repeated for each loop: length L."""
  return jnp.tile(v_U, cfg.loops) if cfg.loops > 1 else v_U


def loop_scan(cfg, layer: Callable, params, lora, carry: dict, xs: dict, unroll: bool):
  """layer(params_u, carry, xs_i) -> (carry, ys) over the L effective blocks: an outer
  lax.scan over the K loops (scanning the LoRA factors and the loop's rows of the
  per-layer inputs) around an inner scan over the U unique blocks; the shared parameters
  are a constant of the outer scan, so their gradient is accumulated over the loops. ys
  come back with a leading L axis."""
  k, u = cfg.loops, unique_layers(cfg)
  xs_KxU = jax.tree.map(lambda a: a.reshape((k, u) + a.shape[1:]), xs)

  def one_loop(c, loop_xs):
    x_U, lora_U = loop_xs

    def one_block(c, block_xs):
      p, x, lora_u = block_xs
      return layer(merge(p, lora_u), c, x)
    return jax.lax.scan(one_block, c, (params, x_U, lora_U), unroll=unroll)

  carry, ys = jax.lax.scan(one_loop, carry, (xs_KxU, lora), unroll=unroll)
  return carry, jax.tree.map(lambda a: a.reshape((k * u,) + a.shape[2:]), ys)


def validate(cfg) -> None:
  """Checks model.loops and model.loop_lora_rank against the rest of the config."""
  m = cfg.model
  if not isinstance(m.loops, int) or m.loops < 1 or m.num_layers % m.loops:
    raise invalid('model.loops', m.loops, f'a positive divisor of model.num_layers={m.num_layers}')
  if not isinstance(m.loop_lora_rank, int) or m.loop_lora_rank < 0:
    raise invalid('model.loop_lora_rank', m.loop_lora_rank, 'a non-negative integer (0 = plain tying)')
  if m.loops == 1:
    if m.loop_lora_rank:
      raise invalid('model.loop_lora_rank', m.loop_lora_rank, '0 unless model.loops > 1')
    return
  if residual.DESIGNS[m.residual].history is not None:
    raise invalid('model.residual', m.residual, 'a design without a per-layer history ('
                  + ', '.join(n for n, d in residual.DESIGNS.items() if d.history is None)
                  + ') with model.loops > 1')
  if m.mlp_taper != 'none':
    raise invalid('model.mlp_taper', m.mlp_taper, "'none' with model.loops > 1 (one width per shared block)")
  for field in ('prune_layers', 'remove_norms_every'):
    if cfg.posthoc[field]:
      raise invalid(f'posthoc.{field}', cfg.posthoc[field],
                    '0 with model.loops > 1 (its blocks and norms are per layer)')
  if m.loop_lora_rank and cfg.optim.name != 'adamw':
    raise invalid('optim.name', cfg.optim.name, "'adamw' with model.loop_lora_rank > 0 (no Muon "
                  'axes for the LoRA factors)')
  if cfg.optim.qk_slow_factor != 1:
    raise invalid('optim.qk_slow_factor', cfg.optim.qk_slow_factor,
                  '1 with model.loops > 1 (a per-layer LR on shared weights is undefined)')
  if m.loop_lora_rank and PLACEMENTS[m.block].unit_sphere:
    raise invalid('model.loop_lora_rank', m.loop_lora_rank,
                  f'0 with model.block={m.block} (W + B A leaves the unit sphere)')
