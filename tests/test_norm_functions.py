"""Norm functions, GPAS, QK-norm scores and LayerRoPE's rotation, checked against
float64 references or their defining property (spec sections 10, 12-15)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.config import default_config
from depthscale.model import inner_norms, layer_rope, norms
from depthscale.model.placements import gpas
from tests.helpers import covers, small_config, validates_unless

D = 16


def _x(shape=(3, 5, D), seed=0, scale=2.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), shape)


def _model_cfg(**kw):
  m = default_config().model
  for k, v in kw.items():
    m[k] = v
  return m


def _apply(module, x, params=None):
  if params is None:
    params = module.init(jax.random.PRNGKey(0), x).get('params', {})
  return module.apply({'params': params}, x), params


@covers('norms.NORMS', 'layernorm', 'rmsnorm')
def test_layernorm_and_rmsnorm_match_float64_references():
  x = _x()
  x64 = np.asarray(x, np.float64)
  ln, _ = _apply(norms.LayerNorm(), x)
  ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(ln, ref, atol=1e-5)
  rms, _ = _apply(norms.RMSNorm(eps=1e-6), x)
  np.testing.assert_allclose(rms, x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6),
                             atol=1e-5)


def test_rmsnorm_is_scale_invariant_with_unit_rms():
  x = _x()
  y, p = _apply(norms.RMSNorm(), x)
  y3, _ = _apply(norms.RMSNorm(), 3.0 * x, p)
  np.testing.assert_allclose(y3, y, atol=1e-5)
  np.testing.assert_allclose(np.sqrt(np.mean(np.square(y), -1)), 1.0, atol=1e-4)


@covers('norms.NORMS', 'scalenorm')
def test_scalenorm_output_norm_is_g():
  y, p = _apply(norms.ScaleNorm(), _x())
  assert p['scale'] == pytest.approx(math.sqrt(D))
  p = {'scale': jnp.float32(2.5)}
  y, _ = _apply(norms.ScaleNorm(), _x(), p)
  np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 2.5, rtol=1e-5)


@pytest.mark.parametrize('kind', ['dyt', 'derf'])
def test_pointwise_norms_are_elementwise_and_odd(kind):
  module = norms.NORMS[kind].module(alpha0=0.7)
  x = _x((D,))
  _, params = _apply(module, x)
  params = {**params, 'bias': jnp.zeros(D)}  # odd needs b = 0 (the init)
  f = lambda v: module.apply({'params': params}, v)
  jac = np.asarray(jax.jacfwd(f)(x))
  np.testing.assert_array_equal(jac - np.diag(np.diag(jac)), 0)
  assert np.all(np.diag(jac) > 0)
  np.testing.assert_allclose(f(-x), -f(x), atol=1e-6)
  expected = {'dyt': np.tanh(0.7 * np.asarray(x, np.float64)),
              'derf': np.vectorize(math.erf)(0.7 * np.asarray(x, np.float64))}[kind]
  np.testing.assert_allclose(f(x), expected, atol=1e-6)


@covers('norms.NORMS', 'bhyt')
def test_bhyt_star_is_scale_invariant():
  module = norms.BHyT(alpha0=2.0, kappa=10.0)
  x = _x()
  y, p = _apply(module, x)
  y5, _ = _apply(module, 5.0 * x, p)
  np.testing.assert_allclose(y5, y, atol=1e-5)
  x64 = np.asarray(x, np.float64)
  ref = np.tanh(2.0 * x64 / (10.0 * np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)))
  np.testing.assert_allclose(y, ref, atol=1e-5)


def test_seednorm_with_alpha_zero_is_rmsnorm():
  x = _x()
  _, p = _apply(norms.SeeDNorm(), x)
  p = {**p, 'alpha': jnp.zeros(D), 'beta': jax.random.normal(jax.random.PRNGKey(3), (D,))}
  y, _ = _apply(norms.SeeDNorm(), x, p)
  rms, _ = _apply(norms.RMSNorm(), x)
  np.testing.assert_allclose(y, rms, atol=1e-6)
  p['alpha'] = jnp.ones(D)  # and alpha != 0 makes the gain input-dependent
  assert not np.allclose(_apply(norms.SeeDNorm(), x, p)[0], rms, atol=1e-3)


@covers('norms.NORMS', 'none')
def test_none_is_identity_and_make_norm_builds_every_function():
  x = _x()
  np.testing.assert_array_equal(_apply(norms.Identity(), x)[0], x)
  for kind in norms.NORMS:
    for position in norms.POSITIONS:
      module = norms.make_norm(_model_cfg(norm=kind), 'n', position=position)
      assert _apply(module, x)[0].shape == x.shape
  bhyt_final = norms.make_norm(_model_cfg(norm='bhyt'), 'n', position='final')
  assert isinstance(bhyt_final, norms.RMSNorm)  # lambda_last = 0: the final norm stays RMSNorm
  dyt = norms.make_norm(_model_cfg(norm='dyt', norm_alpha_mlp=0.2), 'n', position='mlp')
  assert dyt.alpha0 == 0.2


def test_gpas_has_identity_input_gradient_and_scaled_forward():
  x, v = _x(seed=1), _x(seed=2)
  for a in (0.0, 0.8, -1.5):
    a = jnp.float32(a)
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(gpas(a, x) * v))(x), v)
    np.testing.assert_allclose(gpas(a, x), (1 - jax.nn.silu(a)) * x, rtol=1e-6)
  np.testing.assert_array_equal(gpas(jnp.float32(0.0), x), x)


class _Scores(nn.Module):
  cfg: object

  @nn.compact
  def __call__(self, q, k):
    q, k, scale = inner_norms.scores(self, self.cfg, q, k)
    return jnp.einsum('bqhe,bkhe->bhqk', q, k) * (scale if scale is not None else 1.0)


@covers('inner_norms.QK_NORMS', 'l2_learned_scale')
def test_henry_qk_norm_bounds_logits_by_g():
  cfg = _model_cfg(qk_norm='l2_learned_scale', qk_norm_seq_len=1024)
  assert inner_norms.henry_g0(1024) == pytest.approx(19.999, abs=1e-3)
  q, k = _x((2, 7, 2, 8), 1, 10.0), _x((2, 7, 2, 8), 2, 10.0)
  module = _Scores(cfg)
  p = module.init(jax.random.PRNGKey(0), q, k)['params']
  logits = module.apply({'params': p}, q, k)
  g = float(p['qk_scale'])
  assert g == pytest.approx(19.999, abs=1e-3)
  assert np.abs(logits).max() <= g * (1 + 1e-6)
  np.testing.assert_allclose(module.apply({'params': p}, 3.0 * q, 0.5 * k), logits, rtol=1e-4)


def test_layer_rope_rotation():
  gain = jax.random.normal(jax.random.PRNGKey(0), (D,))
  np.testing.assert_array_equal(layer_rope.rotate(gain, jnp.float32(0.0), 1e4), gain)
  rotated = layer_rope.rotate(gain, jnp.float32(2.0), 1e4)
  pairs = lambda g: np.linalg.norm(np.asarray(g).reshape(-1, 2), axis=-1)
  np.testing.assert_allclose(pairs(rotated), pairs(gain), rtol=1e-5)  # a rotation per pair
  c, s = math.cos(2.0), math.sin(2.0)  # pair 0 turns by angle * base^0
  np.testing.assert_allclose(rotated[:2], [c * gain[0] - s * gain[1], s * gain[0] + c * gain[1]],
                             rtol=1e-5)


@covers('norms.NORMS', 'seednorm')
def test_seednorm_with_random_parameters_matches_float64():
  """[tanh(x . beta) alpha + g] x / RMS(x) with random alpha, beta, g (beyond alpha = 0)."""
  x = _x()
  _, p = _apply(norms.SeeDNorm(), x)
  p = {k: jax.random.normal(jax.random.PRNGKey(10 + i), (D,)) for i, k in enumerate(sorted(p))}
  y, _ = _apply(norms.SeeDNorm(), x, p)
  x64, q = np.asarray(x, np.float64), {k: np.asarray(v, np.float64) for k, v in p.items()}
  gain = np.tanh(x64 @ q['beta'])[..., None] * q['alpha'] + q['scale']
  np.testing.assert_allclose(y, gain * x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5),
                             rtol=1e-5, atol=1e-5)


@covers('norms.NORMS', 'dyt', 'derf')
@pytest.mark.parametrize('kind', ['dyt', 'derf'])
def test_pointwise_norms_with_random_parameters_match_float64(kind):
  """DyT g tanh(alpha x) + b; Derf g erf(alpha x + s) + b with a nonzero shift s."""
  x = _x()
  _, p = _apply(norms.NORMS[kind].module(alpha0=0.7), x)
  p = {**p, 'alpha': jnp.float32(0.45), 'scale': jax.random.normal(jax.random.PRNGKey(20), (D,)),
       'bias': jax.random.normal(jax.random.PRNGKey(21), (D,))}
  if kind == 'derf':
    p['shift'] = jnp.float32(-0.8)
  y, _ = _apply(norms.NORMS[kind].module(alpha0=0.7), x, p)
  z = 0.45 * np.asarray(x, np.float64) + (-0.8 if kind == 'derf' else 0.0)
  u = np.tanh(z) if kind == 'dyt' else np.vectorize(math.erf)(z)
  ref = u * np.asarray(p['scale'], np.float64) + np.asarray(p['bias'], np.float64)
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('field', sorted(norms.OPTIONS))
@pytest.mark.parametrize('kind', sorted(norms.NORMS))
def test_validation_reads_the_norm_rows(kind, field):
  """model.norm_bias and model.layer_rope validate with exactly the norms whose row has the
  fact; with another norm they fail in one line naming the field and those norms."""
  cfg = small_config(**{'model.norm': kind, f'model.{field}': True})
  takes = [name for name, row in norms.NORMS.items() if getattr(row, norms.OPTIONS[field])]
  validates_unless(kind not in takes, cfg, rf'^model.{field}=True is invalid: allowed False '
                                           rf'unless model.norm in {", ".join(takes)}$')


@pytest.mark.parametrize('kind', sorted(norms.NORMS))
def test_norm_rows_state_what_the_modules_do(kind):
  """A row's facts hold for its module: `bias` adds a bias with model.norm_bias, `layer_rope`
  drops the gain LayerRoPE replaces, `removable` holds a frozen divisor."""
  row, x = norms.NORMS[kind], _x()

  def names(use_scale=True, **kw):  # the module's parameter names (shapes only, no compute)
    module = norms.make_norm(_model_cfg(norm=kind, **kw), 'n', use_scale=use_scale)
    return set(jax.eval_shape(module.init, jax.random.PRNGKey(0), x).get('params', {}))

  assert row.bias == ('bias' in names(norm_bias=True) - names(norm_bias=False))
  assert row.layer_rope == ('scale' in names() - names(use_scale=False))
  assert row.removable == ('divisor' in names(norm_divisors=True))
