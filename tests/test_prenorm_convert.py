"""CRMSNorm and the Pre-LN = Pre-RMSNorm = Pre-CRMSNorm equivalence (Jiang et al. 2023): the
norm against its float64 formula, and the converted models' logits against the Pre-LN
model's with every gain, bias and matrix away from init, in float32 (the models) and in a
float64 numpy reference of the whole LM (the math)."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model import prenorm_convert
from depthscale.model.norms import CRMSNorm
from depthscale.model.transformer import make_model
from tests.helpers import covers, init, perturb, small_config, tokens
from tests.test_method_properties import _causal_attention64, _out64, _qkv64, _rope64
from tests.test_mlp_variants import _mlp64

D = 16
EPS = 1e-5


def _norm64(kind: str, p, x):
  """LayerNorm, RMSNorm or CRMSNorm (decompressed) with gain and bias, float64."""
  g, b = (np.asarray(p[k], np.float64) for k in ('scale', 'bias'))
  if kind == 'crmsnorm':  # the paper's formula on c = x[:D-1]; z = [c, -sum c] / rms
    c = x[..., :-1]
    s = c.sum(-1, keepdims=True)
    r = 1 / np.sqrt(((c ** 2).sum(-1, keepdims=True) + s ** 2) / x.shape[-1] + EPS)
    return np.concatenate([c * r, -s * r], -1) * g + b
  if kind == 'layernorm':
    x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + EPS) * g + b


@covers('norms.NORMS', 'crmsnorm')
def test_crmsnorm_is_rmsnorm_of_the_zero_mean_vector_it_compresses():
  """CRMSNorm(x) reads c = x[:D-1] only: equals the float64 formula, and g * RMSNorm(z) + b
  for z = [c, -sum(c)]; the discarded slot x[D-1] changes nothing."""
  x = 3.0 * jax.random.normal(jax.random.PRNGKey(0), (3, 5, D)) + 1.0
  module = CRMSNorm(use_bias=True)
  p = perturb(nn.unbox(module.init(jax.random.PRNGKey(0), x)['params']), seed=1, scale=0.5)
  out = module.apply({'params': p}, x)
  x64 = np.asarray(x, np.float64)
  np.testing.assert_allclose(out, _norm64('crmsnorm', p, x64), rtol=1e-5, atol=1e-5)
  c = x64[..., :-1]
  z = np.concatenate([c, -c.sum(-1, keepdims=True)], -1)
  np.testing.assert_allclose(out, _norm64('rmsnorm', p, z), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(module.apply({'params': p}, x.at[..., -1].set(-7.0)), out)


def _lm64(cfg, params, toks, norm: str):
  """The Pre-norm LM by its equations in float64 numpy: x + Attn(N(x)), h + MLP(N(h)),
  head(N_f(x)), learned positions or RoPE."""
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = p64['embedding'][np.asarray(toks)]
  if cfg.position == 'learned':
    x = x + p64['pos_embedding'][:x.shape[1]]
  rope = (lambda u: _rope64(u, cfg.rope_base)) if cfg.position == 'rope' else (lambda u: u)
  for l in range(cfg.num_layers):
    p = jax.tree.map(lambda a, l=l: a[l], p64['blocks'])
    q, k, v = _qkv64(_norm64(norm, p['attn_norm'], x), p['attn'])
    x = x + _out64(_causal_attention64(rope(q) / math.sqrt(q.shape[-1]), rope(k), v), p['attn'])
    x = x + _mlp64(cfg.mlp, p['mlp'], _norm64(norm, p['mlp_norm'], x))
  return _norm64(norm, p64['final_norm'], x) @ p64['head']


def test_pre_ln_pre_rmsnorm_pre_crmsnorm_give_the_same_logits():
  """Learned positions (a second stream writer) and squared ReLU; RoPE and the other
  activations do not touch the stream."""
  over = {'model.tie_embeddings': False, 'model.position': 'learned', 'model.mlp': 'relu2'}
  cfg = small_config(**over)
  _, params = init(**over)
  params = perturb(params, seed=7, scale=0.3)  # LN gains and biases far from (1, 0)
  toks = tokens(cfg)
  rms_cfg, rms_params = prenorm_convert.to_pre_rmsnorm(cfg, params)
  crms_cfg, crms_params = prenorm_convert.to_pre_crmsnorm(cfg, params)
  assert (rms_cfg.model.norm, crms_cfg.model.norm) == ('rmsnorm', 'crmsnorm')
  ref = _lm64(cfg.model, params, toks, 'layernorm')
  params64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  for convert in (prenorm_convert.to_pre_rmsnorm, prenorm_convert.to_pre_crmsnorm):
    c, p = convert(cfg, params64)
    validate(c)
    np.testing.assert_allclose(_lm64(c.model, p, toks, c.model.norm), ref, rtol=1e-12,
                               atol=1e-12, err_msg=c.model.norm)  # the math, float64
  logits = {}
  for name, c, p in (('ln', cfg, params), ('rms', rms_cfg, rms_params),
                     ('crms', crms_cfg, crms_params)):
    logits[name], _ = make_model(c).apply({'params': p}, toks)
    np.testing.assert_allclose(logits[name], ref, rtol=2e-4, atol=2e-4, err_msg=name)
  np.testing.assert_allclose(logits['rms'], logits['ln'], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(logits['crms'], logits['ln'], rtol=1e-4, atol=1e-4)
  unconverted, _ = make_model(rms_cfg).apply({'params': params}, toks)  # centering matters
  assert np.max(np.abs(unconverted - logits['ln'])) > 1e-2
  assert not np.any(crms_params['embedding'][:, -1])  # the discarded slot is never written


@pytest.mark.parametrize('over,field', [
    ({'model.tie_embeddings': True}, 'model.tie_embeddings'),
    ({'model.tie_embeddings': False, 'model.block': 'post_ln'}, 'model.block'),
    ({'model.tie_embeddings': False, 'model.norm': 'rmsnorm'}, 'model.norm'),
    ({'model.tie_embeddings': False, 'model.residual': 'laurel'}, 'model.residual'),
])
def test_unsupported_models_are_refused_in_one_line(over, field):
  with pytest.raises(ConfigError, match=f'^{field}=.* is invalid: allowed .* to convert a '
                                        'Pre-LN model$'):
    prenorm_convert.to_pre_crmsnorm(small_config(**over), {})


@pytest.mark.parametrize('over,field', [({'model.norm_bias': True}, 'model.norm_bias'),
                                        ({'model.norm': 'crmsnorm', 'model.block': 'post_ln'},
                                         'model.norm')])
def test_bad_norm_fields_fail_in_one_line(over, field):
  with pytest.raises(ConfigError, match=f'^{field}=.* is invalid: allowed '):
    validate(small_config(**over))
