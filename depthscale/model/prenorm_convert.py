"""Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm: the same function with converted weights (Jiang et
al. 2023, arXiv 2305.14858; checked against the authors' example.py).

LayerNorm removes the mean of its input, so the mean of the residual stream never matters in
Pre-LN. Writing only zero-mean vectors into the stream (the embedding rows and every output
projection's D outputs centered) changes nothing, and on a zero-mean stream LN(x) = RMSNorm(x)
with the same gain and bias. A zero-mean z is also fully given by c = z[:D-1] (z[D-1] =
-sum(c)): CRMSNorm reads c alone, so the converted writers leave slot D-1 at zero.

The block's matrices have no bias here, so LayerNorm's affine (g, b) stays in the norm (the
paper folds it into the following linear layer): the targets are model.norm=rmsnorm /
crmsnorm with model.norm_bias=True. Supported: model.block=pre_ln, model.norm=layernorm,
model.residual=standard, untied embeddings, no FixNorm, Peri embedding norm, LayerRoPE,
GPAS, MoDA or parallel block (any MLP, position, taper, QK-norm, LNS or value residual).
"""

from __future__ import annotations

import numpy as np

from depthscale.errors import invalid
from depthscale.model.placements import PLACEMENTS, with_modifier

_REQUIRED = {'norm': 'layernorm', 'residual': 'standard',
             'tie_embeddings': False, 'fix_norm': False, 'peri_embed_norm': False,
             'layer_rope': False, 'gpas': False, 'moda': False, 'parallel_block': 'none'}
# The parameters that write into the residual stream, by path; D is their last axis.
_WRITERS = (('embedding',), ('pos_embedding',), ('blocks', 'attn', 'o'), ('blocks', 'mlp', 'wo'))


def check_convertible(cfg) -> None:
  """Raises ConfigError for a model the conversion does not support (cfg: the full config)."""
  if 'crmsnorm' not in PLACEMENTS[cfg.model.block].modifiers:
    raise invalid('model.block', cfg.model.block,
                  ', '.join(with_modifier('crmsnorm')) + ' to convert a Pre-LN model')
  for field, value in _REQUIRED.items():
    if cfg.model[field] != value:
      raise invalid(f'model.{field}', cfg.model[field], f'{value!r} to convert a Pre-LN model')


def _map_writers(params: dict, fn) -> dict:
  """params with fn applied to every stream writer present (a new tree; the rest shared)."""
  def update(tree: dict, path: tuple) -> dict:
    if path[0] not in tree:
      return tree
    child = fn(tree[path[0]]) if len(path) == 1 else update(tree[path[0]], path[1:])
    return {**tree, path[0]: child}
  for path in _WRITERS:
    params = update(params, path)
  return params


def _converted_config(cfg, norm: str):
  out = cfg.copy_and_resolve_references()
  out.model.norm, out.model.norm_bias = norm, True
  return out


def to_pre_rmsnorm(cfg, params: dict):
  """(config, params) of the Pre-RMSNorm model equal to the Pre-LN model (cfg, params; jax
  or numpy arrays, kept so): every stream writer centered over D, norm gains and biases kept."""
  check_convertible(cfg)
  centered = _map_writers(params, lambda w: w - w.mean(axis=-1, keepdims=True))
  return _converted_config(cfg, 'rmsnorm'), centered


def to_pre_crmsnorm(cfg, params: dict):
  """(config, params) of the Pre-CRMSNorm model equal to the Pre-LN model (cfg, params): the
  centered writers with their discarded slot D-1 zeroed (the stream holds c = z[:D-1])."""
  _, centered = to_pre_rmsnorm(cfg, params)
  compressed = _map_writers(centered, lambda w: w * (np.arange(w.shape[-1]) < w.shape[-1] - 1))
  return _converted_config(cfg, 'crmsnorm'), compressed
