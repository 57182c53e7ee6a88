"""Periodic analyses against float64 numpy on a tiny Pre-LN model whose block 2 has zero
branches (the identity): its skip loss, Jacobian deviation and angular distance are 0."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model.placements import layer_schedule
from depthscale.model.transformer import Block, Transformer, make_model
from depthscale.training import analysis, sharding
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state
from tests.helpers import tiny_config

ZERO = 1  # 0-based index of the identity block


def _log_softmax64(logits):
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _erank64(m):
  s = np.linalg.svd(np.asarray(m, np.float64), compute_uv=False)
  if s.sum() == 0:
    return 0.0
  p = s / s.sum()
  p = p[p > 0]
  return np.exp(-(p * np.log(p)).sum())


@pytest.fixture(scope='module')
def analysed():
  cfg = tiny_config(**{'model.block': 'pre_ln'})
  model = make_model(cfg)
  init = init_state(model, make_optimizer(cfg), 0, cfg.data.seq_len)['params']
  noise = init_state(model, make_optimizer(cfg), 1, cfg.data.seq_len)['params']
  params = jax.tree.map(lambda a, b: a + 0.5 * b, init, noise)  # rotated away from init
  for sub, name in (('attn', 'o'), ('mlp', 'wo')):
    params['blocks'][sub][name] = params['blocks'][sub][name].at[ZERO].set(0.0)
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, cfg.data.seq_len + 1), 0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': jnp.ones((2, cfg.data.seq_len), jnp.float32)}
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  layers, scalars = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0)(params)
  return cfg, model, init, params, batch, layers, scalars


def _streams(cfg, model, params, batch, skip=None):
  """h_0..h_L by a Python loop over blocks (the reference), block `skip` left out."""
  run = jax.jit(lambda p, c, l: Block(model.cfg).apply({'params': p}, c, l)[0])
  sched = layer_schedule(model.cfg)
  hs = [model.apply({'params': params}, batch['inputs'], method=Transformer.embed)]
  for l in range(cfg.model.num_layers):
    p_l = jax.tree.map(lambda a, l=l: a[l], params['blocks'])
    x = run(p_l, {'x': hs[-1]}, jax.tree.map(lambda a, l=l: a[l], sched))['x']
    hs.append(hs[-1] if l == skip else x)
  return hs


def _loss64(model, params, h, batch):
  logp = _log_softmax64(model.apply({'params': params}, h, method=Transformer.unembed))
  t = np.asarray(batch['targets'])
  return -np.take_along_axis(logp, t[..., None], -1).mean()


def test_identity_block_skip_jacobian_and_angle_are_zero(analysed):
  *_, layers, _ = analysed
  assert layers['skip_delta_loss'][ZERO] == pytest.approx(0.0, abs=1e-6)
  assert layers['jacobian_identity_dev'][ZERO] == pytest.approx(0.0, abs=1e-6)
  assert layers['angular_distance'][ZERO] == 0.0
  for l in (0, 2):  # the other blocks are not the identity
    assert layers['jacobian_identity_dev'][l] > 1e-2 and layers['angular_distance'][l] > 1e-3


def test_analyses_match_float64_numpy(analysed):
  cfg, model, init, params, batch, layers, _ = analysed
  hs = _streams(cfg, model, params, batch)
  L = cfg.model.num_layers
  last = [np.asarray(h[:, -1], np.float64) for h in hs]
  cos = [np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
         for a, b in zip(last[:-1], last[1:])]
  expected_angle = [np.mean(np.arccos(np.clip(c, -1, 1)) / np.pi) for c in cos]
  np.testing.assert_allclose(layers['angular_distance'], expected_angle, atol=2e-5)

  logp = [_log_softmax64(model.apply({'params': params}, h, method=Transformer.unembed)) for h in hs[1:]]
  kl = [np.mean(np.sum(np.exp(lp) * (lp - logp[-1]), -1)) for lp in logp]
  top = lambda lp: np.argsort(-lp, -1)[..., :5]
  overlap = [np.mean([[len(set(a) & set(b)) / 5 for a, b in zip(ra, rb)]
                      for ra, rb in zip(top(lp), top(logp[-1]))]) for lp in logp]
  np.testing.assert_allclose(layers['logit_lens_kl'], kl, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(layers['logit_lens_top5'], overlap, atol=1e-6)

  base = _loss64(model, params, hs[-1], batch)
  skip = [_loss64(model, params, _streams(cfg, model, params, batch, s)[-1], batch) - base
          for s in range(L)]
  np.testing.assert_allclose(layers['skip_delta_loss'], skip, atol=2e-5)

  acts = [np.asarray(h, np.float64).reshape(-1, cfg.model.d_model) for h in hs[1:]]
  np.testing.assert_allclose(layers['erank_acts'], [_erank64(a - a.mean(0)) for a in acts], rtol=1e-4)
  mats = [w for w in jax.tree.leaves(params['blocks']) if w.ndim >= 3]
  weights = [np.mean([_erank64(analysis.as_matrix(np.asarray(w), cfg.model.d_model)[l]) for w in mats])
             for l in range(L)]
  np.testing.assert_allclose(layers['erank_weights'], weights, rtol=1e-4)

  vec = lambda t, l: np.concatenate([np.asarray(w[l], np.float64).ravel()
                                     for w in jax.tree.leaves(t['blocks']) if w.ndim >= 3])
  rot = [1 - vec(params, l) @ vec(init, l) / np.linalg.norm(vec(params, l)) / np.linalg.norm(vec(init, l))
         for l in range(L)]
  np.testing.assert_allclose(layers['param_rotation'], rot, rtol=1e-6)

  ent_max = np.log(cfg.data.seq_len)
  assert all(0 < a <= b <= ent_max for a, b in zip(layers['attn_entropy_min'], layers['attn_entropy_mean']))


def test_effective_depth_definitions():
  assert analysis.ed_cos(np.array([0.2, -0.1, 0.3, -0.2, 0.1, 0.4])) == 3.0
  assert np.isnan(analysis.ed_cos(np.array([0.1, 0.2, 0.3])))
  assert analysis.ed_kl(np.array([4.0, 3.0, 1.9, 1.0, 0.0])) == 2.0
  assert analysis.ed_overlap(np.array([0.0, 0.2, 0.4, 1.0])) == 2.0
  assert analysis.ed_skip(np.array([0.5, 0.0, 4.0, 0.5, -1.0])) == 2.0  # 4.0 + 0.5 >= 0.9 * 5
  assert analysis.ed_skip(np.array([-0.1, 0.0])) == 0.0
  scalars = analysis.effective_depths({'cos_mean': np.array([-1.0, 1.0, 1.0, 1.0]),
                                       'logit_lens_kl': np.array([3.0, 1.0, 0.5, 0.0]),
                                       'logit_lens_top5': np.array([0.0, 0.2, 0.4, 1.0]),
                                       'skip_delta_loss': np.array([1.0, 1.0, 1.0, 1.0])})
  assert scalars == {'effective_depth/cos': 0.0, 'effective_depth/cos_ratio': 0.25,
                     'effective_depth/kl': 1.0, 'effective_depth/kl_ratio': 0.5,
                     'effective_depth/overlap': 2.0, 'effective_depth/overlap_ratio': 0.75,
                     'effective_depth/skip': 4.0, 'effective_depth/skip_ratio': 1.0}
