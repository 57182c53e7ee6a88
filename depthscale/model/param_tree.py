"""What a leaf of the parameter tree is: its path keys, kind, optimizer group and axes.

The one place every consumer (parametrization, optimizer, LLR, nGPT, sharding) asks "what
kind of parameter is this"; a leaf module: it imports nothing from depthscale. Under
'blocks' every leaf has a leading layer axis (the scanned stack).
"""

from __future__ import annotations

EMBEDDING_PARAMS = ('embedding', 'pos_embedding', 'head')  # outside the non-embedding count
KINDS = ('embedding', 'residual', 'matrix', 'norm')
LOOP_LORA = 'loop_lora'  # relaxed recursion's per-loop LoRA factors (depthscale.model.recurrence)
GROUPS = ('embedding', 'outer', 'hidden_matrix', 'hidden_vector', LOOP_LORA)  # parametrization groups
# Leading axes (after the layer axis) that form a block matrix's fan-in.
FAN_IN_DIMS = {'q': 1, 'kv': 1, 'o': 2, 'wi': 1, 'wo': 1}
# Axis of D (d_model) in each matrix, without the layer axis: rows of E_in, W_q, W_k, W_v,
# W_in are indexed by their D inputs (first axis), W_O, W_out and E_out by D outputs.
EMBED_AXIS = {'embedding': -1, 'head': 0, 'q': 0, 'kv': 0, 'wi': 0, 'o': -1, 'wo': -1}


def path_keys(path) -> tuple[str, ...]:
  """A jax key path as strings: ('blocks', 'attn', 'q')."""
  return tuple(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)


def path_str(path) -> str:
  """'blocks/attn/q'."""
  return '/'.join(path_keys(path))


def in_blocks(path) -> bool:
  """Whether the leaf belongs to the scanned block stack (leading layer axis)."""
  return path_keys(path)[0] == 'blocks'


def per_layer_rank(path, leaf) -> int:
  """The rank of one layer's slice: under 'blocks' the leading axis is the layer axis."""
  return len(leaf.shape) - (1 if in_blocks(path) else 0)


def param_kind(path, leaf) -> str:
  """'embedding', 'residual' (residual-design weights, modules named res_*), 'matrix'
  (per-layer rank >= 2) or 'norm' (norm parameters, learned scales such as nGPT's s_qk
  (H, E) and s_u, s_v (2, F), and every other scalar or vector: gates, gains, alphas)."""
  keys = path_keys(path)
  if keys[0] in EMBEDDING_PARAMS:
    return 'embedding'
  if any(k.startswith('res_') for k in keys):
    return 'residual'
  if any('norm' in k for k in keys) or keys[-1] in ('scale', 'bias') or keys[-1].endswith('_scale'):
    return 'norm'
  return 'matrix' if per_layer_rank(path, leaf) >= 2 else 'norm'


def param_group(path, leaf) -> str:
  """'embedding' (embeddings, untied head), 'outer' (final norm, other parameters outside
  the blocks), 'hidden_matrix' (matrices inside the blocks), 'hidden_vector' (norm gains
  and biases, gates and other scalars or vectors inside the blocks) or 'loop_lora'."""
  kind = param_kind(path, leaf)
  if kind == 'embedding':
    return 'embedding'
  if path_keys(path)[0] == LOOP_LORA:
    return LOOP_LORA
  if not in_blocks(path):
    return 'outer'
  return 'hidden_matrix' if kind == 'matrix' else 'hidden_vector'


def block_matrix(path) -> str | None:
  """The name of a block's linear module (q, kv, o, wi, wo) at path, else None."""
  keys = path_keys(path)
  return keys[-1] if keys[0] == 'blocks' and keys[-1] in FAN_IN_DIMS else None
