"""Modifiers and placements away from their init, where a wiring bug shows: GPAS with a
nonzero gate, LayerRoPE at a nonzero angle, nGPT's update equation, NormFormer's residual
scale and QK-norm 'full' vs 'per_head', each against a reference built from the block's
own attention, MLP and norms."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model import inner_norms, ngpt
from depthscale.model.norms import LayerNorm, RMSNorm
from depthscale.model.transformer import Attention, Mlp
from tests.helpers import covers, init, run_block

D = 16


def _x(seed, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), (2, 16, D))


def _branch(model, p_l, name, x):
  module = Attention(model.cfg) if name == 'attn' else Mlp(model.cfg)
  return module.apply({'params': p_l[name]}, x)


def _ln(p, x, eps=1e-5):
  return LayerNorm(eps=eps).apply({'params': p}, x)


def _layer(params, l):
  return jax.tree.map(lambda a: a[l], params['blocks'])


@pytest.mark.parametrize('block', ['pre_ln', 'post_ln'])
def test_gpas_with_a_nonzero_gate_scales_the_stream_by_one_minus_silu(block):
  """g(x) = (1 - silu(a)) x: Pre-LN g(x + F(N(x))) per sublayer, Post-LN N(g(x) + F(x))."""
  model, params = init(**{'model.block': block, 'model.gpas': True})
  params['blocks']['gpas_gate'] = jnp.array([0.7, -1.3])
  x, l = _x(1), 1
  p = _layer(params, l)
  g = lambda v: (1 - jax.nn.silu(-1.3)) * v
  if block == 'pre_ln':
    h = g(x + _branch(model, p, 'attn', _ln(p['attn_norm'], x)))
    ref = g(h + _branch(model, p, 'mlp', _ln(p['mlp_norm'], h)))
  else:
    h = _ln(p['attn_norm'], g(x) + _branch(model, p, 'attn', x))
    ref = _ln(p['mlp_norm'], g(h) + _branch(model, p, 'mlp', h))
  np.testing.assert_allclose(run_block(model, params, x, l), ref, rtol=1e-5, atol=1e-5)


def _rotate64(gain, angle, base):
  """Pair (2k, 2k+1) of the gain rotated by angle * base^(-2k / D), float64."""
  g = np.asarray(gain, np.float64).reshape(-1, 2)
  phi = angle * base ** (-np.arange(0, D, 2) / D)
  c, s = np.cos(phi), np.sin(phi)
  return np.stack([c * g[:, 0] - s * g[:, 1], s * g[:, 0] + c * g[:, 1]], -1).reshape(D)


def test_layer_rope_block_l_reads_rmsnorm_times_the_gain_rotated_by_l_theta():
  """Block l (1-based): x + F(RMSNorm(x) * s_l R(l theta) gamma), per sublayer."""
  theta = 0.7
  model, params = init(**{'model.layer_rope': True, 'model.layer_rope_theta': theta,
                          'model.norm': 'rmsnorm'})
  gain = 1.0 + 0.5 * jax.random.normal(jax.random.PRNGKey(3), (D,))
  params['layer_rope_gain'] = gain
  params['blocks']['attn_norm']['depth_scale'] = jnp.array([0.9, 1.4])
  params['blocks']['mlp_norm']['depth_scale'] = jnp.array([1.1, 0.6])
  x, l = _x(2), 1
  p = _layer(params, l)
  rotated = jnp.asarray(_rotate64(gain, (l + 1) * theta, model.cfg.layer_rope_base), jnp.float32)
  rms = lambda v: RMSNorm(eps=model.cfg.norm_eps, use_scale=False).apply({}, v)
  h = x + _branch(model, p, 'attn', rms(x) * p['attn_norm']['depth_scale'] * rotated)
  ref = h + _branch(model, p, 'mlp', rms(h) * p['mlp_norm']['depth_scale'] * rotated)
  np.testing.assert_allclose(run_block(model, params, x, l), ref, rtol=1e-4, atol=1e-5)


def test_ngpt_block_follows_the_normalized_update_equation():
  """h <- Norm(h + |alpha| (Norm(F(h)) - h)), alpha = theta s_init sqrt(D) per channel."""
  model, params = init(**{'model.block': 'ngpt', 'model.mlp': 'swiglu'})
  for i, name in enumerate(('attn_alpha', 'mlp_alpha')):
    params['blocks'][name] = 0.3 * jax.random.normal(jax.random.PRNGKey(4 + i), (2, D))
  x = _x(5)
  x = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  p = _layer(params, 0)
  unit = lambda v: np.asarray(v, np.float64) / np.linalg.norm(np.asarray(v, np.float64), axis=-1,
                                                             keepdims=True)
  h = np.asarray(x, np.float64)
  for name in ('attn', 'mlp'):
    alpha = np.abs(np.asarray(p[f'{name}_alpha'], np.float64) * ngpt.ALPHA_INIT * math.sqrt(D))
    f = _branch(model, p, name, jnp.asarray(h, jnp.float32))
    h = unit(h + alpha * (unit(f) - h))
  np.testing.assert_allclose(run_block(model, params, x, 0), h, rtol=1e-4, atol=1e-5)


@covers('placements.modifiers', 'normformer_resid_scale')
def test_normformer_resid_scale_multiplies_the_ffn_skip_only():
  """x' = lambda * y + FFN(LN(y)) with y the attention output (NormFormer's fairseq w_resid):
  the FFN reads the unscaled y."""
  model, params = init(**{'model.block': 'normformer', 'model.normformer_resid_scale': True})
  params['blocks']['mlp_resid_scale'] = 1.0 + jax.random.normal(jax.random.PRNGKey(6), (2, D))
  x = _x(7)
  p = _layer(params, 0)
  y = x + _ln(p['attn_norm_out'], _branch(model, p, 'attn', _ln(p['attn_norm'], x)))
  ref = p['mlp_resid_scale'] * y + _branch(model, p, 'mlp', _ln(p['mlp_norm'], y))
  np.testing.assert_allclose(run_block(model, params, x, 0), ref, rtol=1e-5, atol=1e-5)


class _Qkv(nn.Module):
  cfg: object

  @nn.compact
  def __call__(self, q, k, v):
    return inner_norms.qkv(self, self.cfg, q, k, v)


def _rms64(v, axes):
  v = np.asarray(v, np.float64)
  return v / np.sqrt(np.mean(v ** 2, axis=axes, keepdims=True) + 1e-5)


@covers('inner_norms.QK_NORMS', 'none', 'full', 'per_head')
@pytest.mark.parametrize('mode', ['none', 'full', 'per_head'])
def test_qk_norm_full_normalizes_over_all_heads_and_per_head_over_each(mode):
  """full (OLMo 2): q / RMS over H*E; per_head: q / RMS over E; none: q as projected.
  Heads of very different norms tell the two apart (float64 reference)."""
  model, params = init(**{'model.qk_norm': mode})
  q = np.asarray(jax.random.normal(jax.random.PRNGKey(8), (2, 5, 2, 8)), np.float64)
  q[:, :, 1] *= 10.0
  attn = _layer(params, 0)['attn']
  norms = {k: v for k, v in attn.items() if k.endswith('_norm')}
  q32 = jnp.asarray(q, jnp.float32)
  out = _Qkv(model.cfg).apply({'params': norms}, q32, q32, q32)[0]
  ref = {'none': q, 'full': _rms64(q, (-2, -1)), 'per_head': _rms64(q, -1)}[mode]
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
