"""Norms and scales inside the attention and MLP sublayers, switched on by the
placement's `inner` features or by model.qk_norm. Each hook is the identity when its
feature is off, so depthscale.model calls them unconditionally.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp

from depthscale.model import ngpt
from depthscale.model.norms import l2_normalize, make_norm, rms_norm
from depthscale.model.placements import PLACEMENTS

QK_NORMS = ('none', 'full', 'per_head', 'l2_learned_scale')


def _features(cfg) -> frozenset:
  return PLACEMENTS[cfg.block].inner


def _over_width(norm: nn.Module, x_BxTxNxE):
  """Applies a norm over the full N*E width (before the head split)."""
  b, t, n, e = x_BxTxNxE.shape
  return norm(x_BxTxNxE.reshape(b, t, n * e)).reshape(b, t, n, e)


def qkv(module: nn.Module, cfg, q_BxTxHxE, k_BxTxKxE, v_BxTxKxE):
  """Before RoPE. SimpleNorm: RMSNorm over the full width of q, k, v. HybridNorm:
  per-head RMSNorm of q, k, v over E, one gain shared by the heads. model.qk_norm 'full'
  (OLMo 2: q over H*E, k over K*E, per-channel gains) or 'per_head' (over E)."""
  features = _features(cfg)
  if 'linear' in features:
    return tuple(_over_width(rms_norm(cfg, f'{n}_norm', 'embed'), x)
                 for n, x in (('q', q_BxTxHxE), ('k', k_BxTxKxE), ('v', v_BxTxKxE)))
  if 'qkv' in features:
    return tuple(rms_norm(cfg, f'{n}_norm', 'kv')(x)
                 for n, x in (('q', q_BxTxHxE), ('k', k_BxTxKxE), ('v', v_BxTxKxE)))
  if cfg.qk_norm == 'full':
    q_BxTxHxE = _over_width(rms_norm(cfg, 'q_norm', 'embed'), q_BxTxHxE)
    k_BxTxKxE = _over_width(rms_norm(cfg, 'k_norm', 'embed'), k_BxTxKxE)
  elif cfg.qk_norm == 'per_head':
    q_BxTxHxE = rms_norm(cfg, 'q_norm', 'kv')(q_BxTxHxE)
    k_BxTxKxE = rms_norm(cfg, 'k_norm', 'kv')(k_BxTxKxE)
  return q_BxTxHxE, k_BxTxKxE, v_BxTxKxE


def henry_g0(seq_len: int) -> float:
  """Henry et al.'s initial logit scale g0 = log2(T^2 - T), T the training length."""
  return math.log2(seq_len ** 2 - seq_len)


def scores(module: nn.Module, cfg, q_BxTxHxE, k_BxTxKxE):
  """After RoPE: (q, k, softmax scale or None for 1/sqrt(E)). nGPT: s_qk-scaled unit q, k
  with scale sqrt(E). Henry QKNorm ('l2_learned_scale'): unit q, k and one learnable
  scalar g per attention module (init henry_g0(model.qk_norm_seq_len)) replacing 1/sqrt(E)."""
  if 'ngpt' in _features(cfg):
    q_BxTxHxE, k_BxTxKxE = ngpt.qk(module, q_BxTxHxE, k_BxTxKxE)
    return q_BxTxHxE, k_BxTxKxE, 1.0
  if cfg.qk_norm == 'l2_learned_scale':
    g = module.param('qk_scale', nn.initializers.constant(henry_g0(cfg.qk_norm_seq_len)), (),
                     jnp.float32)
    return l2_normalize(q_BxTxHxE) * g.astype(q_BxTxHxE.dtype), l2_normalize(k_BxTxKxE), 1.0
  return q_BxTxHxE, k_BxTxKxE, None


def heads(module: nn.Module, cfg, o_BxTxHxE):
  """Before W_O. NormFormer HeadScale, paper form: head h times gamma_h (init 1). Sub-LN:
  Norm over the concatenated heads (width D)."""
  features = _features(cfg)
  if 'head_scale' in features and cfg.normformer_head_scale == 'paper':
    o_BxTxHxE = o_BxTxHxE * _head_scale(module, o_BxTxHxE.shape[2])[:, None]
  if 'attn_out' in features:
    o_BxTxHxE = _over_width(make_norm(cfg, 'inner_norm', position='attn'), o_BxTxHxE)
  return o_BxTxHxE


def _head_scale(module: nn.Module, num_heads: int):
  init = nn.with_logical_partitioning(nn.initializers.ones, ('heads',))
  return module.param('head_scale', init, (num_heads,), jnp.float32)


def attn_out(module: nn.Module, cfg, out_BxTxD):
  """After W_O. SimpleNorm: RMSNorm. NormFormer HeadScale, fairseq code form: chunk h of
  D/H features times gamma_h."""
  features = _features(cfg)
  if 'linear' in features:
    out_BxTxD = rms_norm(cfg, 'o_norm', 'embed')(out_BxTxD)
  if 'head_scale' in features and cfg.normformer_head_scale == 'code':
    b, t, d = out_BxTxD.shape
    gamma_H = _head_scale(module, cfg.num_heads)
    out_BxTxD = (out_BxTxD.reshape(b, t, cfg.num_heads, -1) * gamma_H[:, None]).reshape(b, t, d)
  return out_BxTxD


def mlp_in(module: nn.Module, cfg, pre_BxTx2xF):
  """After W_in (SwiGLU: gate and up stacked on axis 2; GELU: BxTxF). SimpleNorm: RMSNorm
  of each output. nGPT: s_u, s_v and sqrt(D)."""
  features = _features(cfg)
  if 'linear' in features:
    if pre_BxTx2xF.ndim == 3:
      return rms_norm(cfg, 'wi_norm', 'mlp')(pre_BxTx2xF)
    return jnp.stack([rms_norm(cfg, f'{n}_norm', 'mlp')(pre_BxTx2xF[..., i, :])
                      for i, n in enumerate(('gate', 'up'))], axis=-2)
  if 'ngpt' in features:
    return ngpt.uv(module, pre_BxTx2xF, cfg.d_model)
  return pre_BxTx2xF


def mlp_mid(module: nn.Module, cfg, h_BxTxF):
  """Before W_out. Sub-LN's LN_m2 and NormFormer's FFN mid-LN: Norm over F (SwiGLU: on
  gate * up, an extrapolation of the authors' GELU code)."""
  del module
  if 'mlp_mid' in _features(cfg):
    return make_norm(cfg, 'inner_norm', axis='mlp', position='mlp')(h_BxTxF)
  return h_BxTxF


def mlp_out(module: nn.Module, cfg, out_BxTxD):
  """After W_out. SimpleNorm: RMSNorm."""
  del module
  if 'linear' in _features(cfg):
    return rms_norm(cfg, 'wo_norm', 'embed')(out_BxTxD)
  return out_BxTxD
