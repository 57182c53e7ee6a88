"""In-step per-layer metrics against float64 numpy: block_stats, gradient/parameter/update
norms of the stats step, the saturation hook; the plain step computes none of them."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale.model.stats import (attention_entropy, block_stats, record_saturation,
                                    saturation_per_layer)
from depthscale.model.transformer import make_model
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step, weighted_loss
from tests.helpers import tiny_config


def _np_norm(x):
  return np.sqrt(np.sum(np.square(x), axis=-1))


def _np_cos(a, b):
  return np.mean(np.sum(a * b, -1) / (_np_norm(a) * _np_norm(b)))


def test_block_stats_match_float64_numpy():
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
  h = np.asarray(jax.random.normal(k1, (2, 8, 16)) * 3 + 1, np.float64)
  a = np.asarray(jax.random.normal(k2, (2, 8, 16)), np.float64)
  m = np.asarray(jax.random.laplace(k3, (2, 8, 16)), np.float64)
  out = h + a + m
  got = block_stats({'x_in': jnp.float32(h), 'attn': jnp.float32(a), 'mlp': jnp.float32(m),
                     'x_out': jnp.float32(out)})
  c = out - out.mean(-1, keepdims=True)
  expected = {
      'act_var': out.var(), 'act_rms': np.sqrt(np.mean(out ** 2)),
      'update_ratio': np.mean(_np_norm(a + m) / _np_norm(h)),
      'attn_contrib': np.mean(_np_norm(a) / _np_norm(h)),
      'mlp_contrib': np.mean(_np_norm(m) / _np_norm(h + a)),
      'cos_in_out': _np_cos(h, out), 'attn_cos': _np_cos(a, h), 'mlp_cos': _np_cos(m, h + a),
      'update_cos': _np_cos(a + m, h), 'max_abs_act': np.abs(out).max(),
      'kurtosis': np.mean(np.mean(c ** 4, -1) / np.mean(c ** 2, -1) ** 2),
  }
  assert set(got) == set(expected)
  for k, v in expected.items():
    np.testing.assert_allclose(float(got[k]), v, rtol=2e-5, err_msg=k)


def test_attention_entropy_matches_float64_numpy():
  kq, kk = jax.random.split(jax.random.PRNGKey(1))
  q = np.asarray(jax.random.normal(kq, (2, 6, 4, 8)), np.float64)
  k = np.asarray(jax.random.normal(kk, (2, 6, 2, 8)), np.float64)  # grouped: 2 kv heads
  got = attention_entropy(jnp.float32(q), jnp.float32(k))
  kr = np.repeat(k, 2, axis=2)
  s = np.einsum('bihe,bjhe->bhij', q, kr) / np.sqrt(8)
  s = np.where(np.tril(np.ones((6, 6), bool)), s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(got, ent.mean(axis=(0, 2)), rtol=1e-5)
  assert float(got[0]) > 0  # later queries spread over several keys


def test_saturation_hook_per_layer_fraction():
  """Scanned like the blocks: the per-layer value is the recorded fraction |u| > 0.99."""

  class Layer(nn.Module):
    @nn.compact
    def __call__(self, c, x):
      record_saturation(self, x)
      return c, None

  xs = jnp.asarray([[0.5, 0.995, -1.0, 0.2], [0.999, -0.999, 0.0, 1.0], [0.1, 0.2, 0.3, 0.4]])
  scanned = nn.scan(Layer, variable_axes={'intermediates': 0}, length=3)
  _, sown = scanned().apply({}, 0.0, xs, mutable=['intermediates'])
  got = saturation_per_layer({'blocks': sown['intermediates']})['saturation']
  np.testing.assert_allclose(got, [0.5, 0.75, 0.0])
  assert saturation_per_layer({}) == {}


@pytest.fixture(scope='module')
def stepped():
  """One stats step and one plain step of a tiny DyT model (large alpha: partly saturated)."""
  cfg = tiny_config(**{'model.norm': 'dyt', 'model.norm_alpha_attn': 40.0,
                       'model.norm_alpha_mlp': 40.0, 'optim.warmup_steps': 0, 'train.steps': 10})
  tx, lr = make_optimizer(cfg), schedule(cfg)
  model = make_model(cfg)
  state = init_state(model, tx, 0, cfg.data.seq_len)
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, cfg.data.seq_len + 1), 0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': jnp.ones((2, cfg.data.seq_len), jnp.float32)}
  _, plain_out = jax.jit(make_train_step(model, tx, lr))(state, batch)
  _, out = jax.jit(make_train_step(make_model(cfg, collect_stats=True), tx, lr))(state, batch)
  return cfg, model, tx, state, batch, jax.device_get(out), jax.device_get(plain_out)


def test_stats_step_gradient_parameter_update_norms(stepped):
  cfg, model, tx, state, batch, out, _ = stepped
  params = state['params']
  logits = jax.jit(model.apply)({'params': params}, batch['inputs'])[0]
  grads = jax.jit(jax.grad(
      lambda p: weighted_loss(model.apply({'params': p}, batch['inputs'])[0], batch)))(params)
  updates, _ = jax.jit(tx.update)(grads, state['opt_state'], params)
  f64 = lambda t: [np.asarray(x, np.float64) for x in jax.tree.leaves(t)]
  per_layer = lambda t: np.sqrt(sum((x.reshape(x.shape[0], -1) ** 2).sum(1) for x in f64(t)))
  b = lambda t: t['blocks']
  lay = out['layers']
  np.testing.assert_allclose(lay['grad_norm_attn'], per_layer(b(grads)['attn']), rtol=1e-4)
  np.testing.assert_allclose(lay['grad_norm_mlp'], per_layer(b(grads)['mlp']), rtol=1e-4)
  np.testing.assert_allclose(lay['param_norm'], per_layer(b(params)), rtol=1e-5)
  np.testing.assert_allclose(lay['update_param_ratio'],
                             per_layer(b(updates)) / per_layer(b(params)), rtol=1e-4)
  assert np.all(lay['update_param_ratio'] > 0)
  np.testing.assert_allclose(out['param_norm'], np.sqrt(sum((x ** 2).sum() for x in f64(params))),
                             rtol=1e-5)
  np.testing.assert_allclose(out['logit_max'], np.asarray(logits).max(), rtol=1e-6)
  assert len(lay['saturation']) == cfg.model.num_layers
  assert np.all((lay['saturation'] > 0) & (lay['saturation'] < 1))


def test_plain_step_has_no_metrics(stepped):
  *_, out, plain = stepped
  assert set(plain) == {'loss', 'grad_norm', 'ok', 'lr', 'layer_grad_norm'}
  # The statistics model keeps its layer scan rolled, the plain one may unroll it: same sum,
  # possibly another summation order, so the losses agree to float32 rounding.
  np.testing.assert_allclose(plain['loss'], out['loss'], rtol=1e-6)
