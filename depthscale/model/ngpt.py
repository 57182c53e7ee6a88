"""nGPT (Loshchilov et al. 2024): every hidden state and weight vector on the
unit sphere, hypersphere updates with eigen learning rates, scaled QK and logits.

A stored scale parameter theta starts at s_scale; its effective value is
theta * s_init / s_scale (the authors' parameterization, which sets the effective LR).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from depthscale.model.norms import l2_normalize
from depthscale.model.param_tree import EMBED_AXIS, in_blocks, path_keys

ALPHA_INIT = 0.05  # s_init of the eigen learning rates alpha_A, alpha_M


def scale_param(module: nn.Module, name: str, shape, axes, s_init: float, s_scale: float):
  """Effective value of a scale parameter stored as theta (init s_scale): theta * s_init / s_scale."""
  init = nn.with_logical_partitioning(nn.initializers.constant(s_scale), axes)
  return module.param(name, init, shape, jnp.float32) * (s_init / s_scale)


def update(x, s):
  """h <- Norm(h + |alpha| * (Norm(F(h)) - h)); alpha in R^D per sublayer."""
  d = x.shape[-1]
  theta = s.param('alpha', nn.initializers.constant(d ** -0.5), (d,), ('embed',))
  alpha = jnp.abs(theta * (ALPHA_INIT * math.sqrt(d))).astype(x.dtype)
  return l2_normalize(x + alpha * (l2_normalize(s.branch(x)) - x))


def qk(module: nn.Module, q_BxTxHxE, k_BxTxHxE):
  """q <- s_qk Norm(q) * sqrt(E), k <- s_qk Norm(k) (after RoPE): softmax scale sqrt(E)."""
  h, e = q_BxTxHxE.shape[-2:]
  s_qk = scale_param(module, 'qk_scale', (h, e), ('heads', 'kv'), 1.0, (h * e) ** -0.5)
  s_qk = s_qk.astype(q_BxTxHxE.dtype)
  return l2_normalize(q_BxTxHxE) * s_qk * math.sqrt(e), l2_normalize(k_BxTxHxE) * s_qk


def uv(module: nn.Module, gate_up_BxTx2xF, d_model: int):
  """SwiGLU inputs scaled by s_u, s_v (init 1) and sqrt(D) (the code's form: both)."""
  f = gate_up_BxTx2xF.shape[-1]
  s_uv = scale_param(module, 'uv_scale', (2, f), (None, 'mlp'), 1.0, 1.0) * math.sqrt(d_model)
  return gate_up_BxTx2xF * s_uv.astype(gate_up_BxTx2xF.dtype)


def logit_scale(module: nn.Module, vocab_size: int, d_model: int):
  """s_z in R^V of the logits z = s_z * (E_out h): s_init 1, s_scale 1/sqrt(D)."""
  return scale_param(module, 'logit_scale', (vocab_size,), ('vocab',), 1.0, d_model ** -0.5)


def unit_init(init, embed_axis: int):
  """Wraps an initializer so each weight vector has unit norm along the D axis."""
  def wrapped(key, shape, dtype=jnp.float32):
    return l2_normalize(init(key, shape, dtype), axis=embed_axis)
  return wrapped


def normalize_matrices(params):
  """Projects every matrix of the model onto unit norm along its D axis."""
  def project(path, p):
    axis = EMBED_AXIS.get(path_keys(path)[-1])
    if axis is None:
      return p
    if in_blocks(path) and axis == 0:
      axis = 1
    return l2_normalize(p, axis=axis)
  return jax.tree_util.tree_map_with_path(project, params)


def renormalize() -> optax.GradientTransformation:
  """Last link of the optimizer chain: updates such that params + updates lie on the
  unit sphere (weight re-normalization after every step)."""
  def update_fn(updates, state, params=None):
    new = normalize_matrices(optax.apply_updates(params, updates))
    return jax.tree.map(jnp.subtract, new, params), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)
