"""Modifiers and placements away from their init, where a wiring bug shows: GPAS with a
nonzero gate, LayerRoPE at a nonzero angle, nGPT's update equation, NormFormer's residual
scale, QK-norm 'full' vs 'per_head', DeepScaleLM's lambda and beta at L > 2 and nGPT's s_qk,
softmax scale, s_uv and s_z, each against a reference built from the block's own attention,
MLP and norms, or in float64 numpy; Peri-LN / Sandwich-LN with LNS, DeepNorm with a GPAS
gate and HybridNorm's FFN input with every gain off init; Sub-LN's and SimpleNorm's inner
norms with their gains off init, in float64 numpy."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model import inner_norms, ngpt
from depthscale.model.norms import LayerNorm, RMSNorm
from depthscale.model.transformer import Attention, Mlp, Transformer
from tests.helpers import covers, init, perturb, run_block

D = 16


def _x(seed, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), (2, 16, D))


def _branch(model, p_l, name, x, index=None):
  """Sublayer `name` of one block's params on x; index: the 1-based block (per-layer inits)."""
  module = Attention(model.cfg) if name == 'attn' else Mlp(model.cfg)
  return module.apply({'params': p_l[name]}, x, index=index)


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


def test_deepscalelm_sublayer_is_lambda_skip_plus_beta_branch_at_four_layers():
  """L = 4: beta^2 = 1/4 differs from lambda^2 = 3/4; each Pre-LN sublayer maps
  x -> lambda x + beta F(LN(x)), gains and matrices off init."""
  model, params = init(**{'model.init': 'deepscalelm', 'model.num_layers': 4})
  params = jax.jit(perturb)(params, 2)
  beta, lam = 0.5, math.sqrt(3) / 2
  x, l = _x(9), 2

  @jax.jit
  def block_and_reference(params, x):  # one program: no other test has these L = 4 shapes
    p = _layer(params, l)
    h = lam * x + beta * _branch(model, p, 'attn', _ln(p['attn_norm'], x), l + 1)
    ref = lam * h + beta * _branch(model, p, 'mlp', _ln(p['mlp_norm'], h), l + 1)
    return run_block(model, params, x, l), ref

  np.testing.assert_allclose(*block_and_reference(params, x), rtol=1e-5, atol=1e-5)


def _ngpt():
  """nGPT's (model, params), every parameter (s_qk, s_uv, s_z, matrices) off its init."""
  model, params = init(**{'model.block': 'ngpt', 'model.mlp': 'swiglu',
                          'model.tie_embeddings': False})
  return model, jax.jit(perturb)(params, 3)


def _f64(*arrays):
  return [np.asarray(a, np.float64) for a in arrays]


def _unit64(v):
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _rope64(x, base):
  """Rotate-half RoPE over the last axis of x[B, T, H, E], float64."""
  t, e = x.shape[1], x.shape[-1]
  angle = np.arange(t)[:, None] * base ** (-np.arange(0, e, 2) / e)
  cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
  x1, x2 = np.split(x, 2, axis=-1)
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _qkv64(x64, p):
  """q, k, v = x W_q, x W_k, x W_v per head, float64, from an attention's params p."""
  wq, wkv = _f64(p['q'], p['kv'])
  return [np.einsum('btd,dhe->bthe', x64, w) for w in (wq, wkv[:, 0], wkv[:, 1])]


def _causal_attention64(q, k, v):
  """Causal softmax(q k^T) v per head, float64; q carries the softmax scale."""
  logits = np.einsum('bqhe,bkhe->bhqk', q, k)
  t = q.shape[1]
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhe->bqhe', probs, v)


def _out64(o, p):
  """The output projection o W_O (o[B, T, H, E]), float64."""
  return np.einsum('bqhe,hed->bqd', o, np.asarray(p['o'], np.float64))


def test_ngpt_attention_uses_s_qk_on_unit_q_k_and_softmax_scale_sqrt_e():
  """softmax(sqrt(E) <s_qk Norm(q), s_qk Norm(k)>) after RoPE, causal, with the effective
  s_qk = theta sqrt(H E) (s_init 1, s_scale (H E)^-1/2); float64 reference."""
  model, params = _ngpt()
  p = _layer(params, 1)['attn']
  x = _x(10)
  x64, theta = _f64(x, p['qk_scale'])
  q, k, v = _qkv64(x64, p)
  s_qk = theta * math.sqrt(theta.size)
  rope = lambda u: _rope64(u, model.cfg.rope_base)
  q = _unit64(rope(q)) * s_qk * math.sqrt(q.shape[-1])
  k = _unit64(rope(k)) * s_qk
  ref = _out64(_causal_attention64(q, k, v), p)
  np.testing.assert_allclose(jax.jit(Attention(model.cfg).apply)({'params': p}, x), ref,
                             rtol=1e-4, atol=1e-5)


def test_ngpt_mlp_scales_gate_and_up_by_s_uv_sqrt_d():
  """SwiGLU on u s_u sqrt(D), v s_v sqrt(D) (s_init = s_scale = 1); float64 reference."""
  model, params = _ngpt()
  p = _layer(params, 1)['mlp']
  x = _x(11)
  x64, wi, wo, s_uv = _f64(x, p['wi'], p['wo'], p['uv_scale'])
  u, v = (np.einsum('btd,df->btf', x64, wi[:, i]) * s_uv[i] * math.sqrt(D) for i in (0, 1))
  ref = (u / (1 + np.exp(-u)) * v) @ wo
  np.testing.assert_allclose(Mlp(model.cfg).apply({'params': p}, x), ref, rtol=1e-4, atol=1e-5)


def test_ngpt_logits_are_s_z_times_the_head_output():
  """z = s_z (h W_head), s_z = theta sqrt(D) (s_init 1, s_scale D^-1/2), no final norm."""
  model, params = _ngpt()
  x = _x(12)
  x64, head, theta = _f64(x, params['head'], params['logit_scale'])
  ref = (x64 @ head) * theta * math.sqrt(D)
  out = model.apply({'params': params}, x, method=Transformer.unembed)
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


_PLACEMENT_OPTIONS = {'peri_ln': {'model.ln_scaling': True, 'model.gpas': True},
                      'sandwich_ln': {'model.ln_scaling': True, 'model.gpas': True},
                      'deepnorm': {'model.gpas': True}}


def _placement_sublayer(block, model, p, name, x, l):
  """One sublayer of block l (0-based) by its equation (docs/methods.md)."""
  f = lambda h: _branch(model, p, name, h)
  ln = lambda key, h: _ln(p[key], h)
  g = (lambda v: (1 - jax.nn.silu(p['gpas_gate'])) * v) if 'gpas_gate' in p else (lambda v: v)
  if block in ('peri_ln', 'sandwich_ln'):  # g(x + LN_out(F(LN_in(x) / sqrt(l))))
    return g(x + ln(f'{name}_norm_out', f(ln(f'{name}_norm', x) / math.sqrt(l + 1))))
  if block == 'deepnorm':  # LN((2L)^(1/4) g(x) + F(x)), L = 2
    return ln(f'{name}_norm', math.sqrt(2) * g(x) + f(x))
  if name == 'attn':  # HybridNorm: x + Attn_QKVnorm(x); z + FFN(z), z = LN(y)
    return x + f(x)
  z = ln('mlp_norm', x)
  return z + f(z)


@pytest.mark.parametrize('block', ['peri_ln', 'sandwich_ln', 'deepnorm', 'hybridnorm'])
def test_placement_block_off_init_follows_its_equation(block):
  """Block 2 with every gain, bias and matrix perturbed and a GPAS gate of -1.3 where on:
  LNS's 1/sqrt(2) on Peri-LN's input norm, GPAS on Peri-LN and DeepNorm, HybridNorm's FFN
  reading the normalized stream."""
  model, params = init(**{'model.block': block, **_PLACEMENT_OPTIONS.get(block, {})})
  params = perturb(params, seed=5)
  if 'gpas_gate' in params['blocks']:
    params['blocks']['gpas_gate'] = jnp.array([0.7, -1.3])
  x, l = _x(13), 1
  p, ref = _layer(params, l), x
  for name in ('attn', 'mlp'):
    ref = _placement_sublayer(block, model, p, name, ref, l)
  np.testing.assert_allclose(run_block(model, params, x, l), ref, rtol=1e-5, atol=1e-5)


def _norm64(p, v, heads=False):
  """LayerNorm (p has a bias) or RMSNorm over the last axis with p's gain, float64; heads:
  over the concatenated heads of v[B, T, H, E] (width H*E)."""
  if heads:
    return _norm64(p, np.reshape(v, (*v.shape[:2], -1))).reshape(v.shape)
  v = np.asarray(v, np.float64)
  if 'bias' in p:
    v = v - v.mean(-1, keepdims=True)
  gain, bias = _f64(p['scale'], p.get('bias', 0.0))
  return _rms64(v, -1) * gain + bias


def _inner_norm_block64(block, model, p, x):
  """Block p on x by its equation, float64. Sub-LN: x + Attn(LN(x)) with LN over the
  concatenated heads before W_O, then h + W_out LN_m(phi(W_in LN(h))). SimpleNorm: x + F(x)
  with RMSNorm after every linear: q, k, v (over the full width), W_O, W_in (SwiGLU: gate
  and up each) and W_out."""
  sub_ln = block == 'sub_ln'
  a, m = p['attn'], p['mlp']
  simple = lambda q, name, v, heads=False: v if sub_ln else _norm64(q[name], v, heads)
  sub = lambda q, v, heads=False: _norm64(q['inner_norm'], v, heads) if sub_ln else v
  rope = lambda u: _rope64(u, model.cfg.rope_base)

  def attn(h):
    q, k, v = (simple(a, f'{n}_norm', u, True) for n, u in zip('qkv', _qkv64(h, a)))
    o = _causal_attention64(rope(q) / math.sqrt(q.shape[-1]), rope(k), v)
    return simple(a, 'o_norm', _out64(sub(a, o, True), a))

  def mlp(h):
    wi, wo = _f64(m['wi'], m['wo'])
    if model.cfg.mlp == 'swiglu':
      g, u = (simple(m, f'{n}_norm', h @ wi[:, i]) for i, n in enumerate(('gate', 'up')))
      f = g / (1 + np.exp(-g)) * u
    else:
      u = simple(m, 'wi_norm', h @ wi)
      f = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
    return simple(m, 'wo_norm', sub(m, f) @ wo)

  read = (lambda name, h: _norm64(p[f'{name}_norm'], h)) if sub_ln else (lambda name, h: h)
  h = np.asarray(x, np.float64)
  h = h + attn(read('attn', h))
  return h + mlp(read('mlp', h))


@pytest.mark.parametrize('block,mlp', [('sub_ln', 'gelu'), ('simple_norm', 'gelu'),
                                       ('simple_norm', 'swiglu')])
def test_inner_norm_block_off_init_follows_its_equation(block, mlp):
  """Sub-LN's and SimpleNorm's block with every gain, bias and matrix perturbed, each inner
  norm's gain in its place (float64 reference)."""
  model, params = init(**{'model.block': block, 'model.mlp': mlp})
  params = perturb(params, seed=6)
  x, l = _x(14), 1
  ref = _inner_norm_block64(block, model, _layer(params, l), x)
  np.testing.assert_allclose(run_block(model, params, x, l), ref, rtol=1e-4, atol=1e-5)
