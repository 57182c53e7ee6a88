"""Parametrizations and init schemes: each by its defining property (spec sections 10, 11)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model import parametrization as pz
from depthscale.model.transformer import Transformer, make_model
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state
from tests.helpers import covers, init, perturb, small_config, tiny_config, validates_unless


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init(model, seq_len):
  """init_state's parameters (seed 0): one program per model, shared by the tests that use it."""
  return init_state(model, optax.identity(), 0, seq_len)['params']


def _params(cfg):
  return _init(make_model(cfg), cfg.data.seq_len)


@functools.partial(jax.jit, static_argnums=0)
def _logits(model, params, tokens):
  """model's logits: one program per model, shared by the tests that use it."""
  return model.apply({'params': params}, tokens)[0]


def _tokens(cfg):
  return jax.random.randint(jax.random.PRNGKey(1), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)


def _first_update(cfg, grad_value: float):
  """The optimizer's first update for gradients filled with grad_value (constant LR)."""
  tx = make_optimizer(cfg)

  @jax.jit
  def update(params):
    grads = jax.tree.map(lambda p: jnp.full_like(p, grad_value), params)
    return tx.update(grads, tx.init(params), params)[0]

  return update(_params(cfg))


def _opt_cfg(**kw):
  return tiny_config(**{'optim.schedule': 'constant', 'optim.warmup_steps': 0,
                        'optim.weight_decay': 0.0, 'optim.clip_norm': 0.0, **kw})


@covers('parametrization.PARAMETRIZATIONS', 'standard', 'mup')
def test_mup_at_base_width_equals_standard():
  std = tiny_config()
  mup = tiny_config(**{'model.parametrization': 'mup', 'model.base_d_model': 32})
  tokens = _tokens(std)
  a = _logits(make_model(std), _params(std), tokens)
  b = _logits(make_model(mup), _params(mup), tokens)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_mup_hidden_lr_halves_when_width_doubles():
  """Adam's first step is lr * sign(g): the effective LR of each parameter."""
  u1 = _first_update(_opt_cfg(**{'model.parametrization': 'mup', 'model.base_d_model': 32}), 1.0)
  u2 = _first_update(_opt_cfg(**{'model.parametrization': 'mup', 'model.base_d_model': 32,
                                 'model.d_model': 64}), 1.0)
  lr = tiny_config().optim.lr
  for name in ('q', 'kv', 'o'):
    np.testing.assert_allclose(np.abs(u1['blocks']['attn'][name]), lr, rtol=1e-5)
    np.testing.assert_allclose(np.abs(u2['blocks']['attn'][name]), lr / 2, rtol=1e-5)
  np.testing.assert_allclose(np.abs(u2['blocks']['mlp']['wo']), lr / 2, rtol=1e-5)
  for u in (u1, u2):  # vector-like and input/output parameters keep eta
    np.testing.assert_allclose(np.abs(u['embedding']), lr, rtol=1e-5)
    np.testing.assert_allclose(np.abs(u['blocks']['attn_norm']['scale']), lr, rtol=1e-5)


def test_mup_init_output_multiplier_and_attention_scale():
  cfg = tiny_config(**{'model.parametrization': 'mup', 'model.base_d_model': 16,
                       'model.d_model': 64, 'model.num_heads': 2})
  p = _params(cfg)
  np.testing.assert_allclose(np.std(p['blocks']['mlp']['wi']), 0.02 / 2, rtol=0.05)  # m_N = 4
  np.testing.assert_allclose(np.std(p['embedding']), 0.02, rtol=0.05)
  assert pz.logit_mult(cfg.model) == pytest.approx(0.25)
  assert pz.attention_scale(cfg.model) == pytest.approx(math.sqrt(8) / 32)  # sqrt(d_h,base)/d_h


def test_mup_forward_at_twice_the_base_width_scales_attention_logits_and_output():
  """m_N = 2 (D 16, base 8, E 8, E_base 4), output_mult 1.5, parameters off init: the muP
  forward is the standard one with attention logits times (2 / 8) / (1 / sqrt(8)) (q scaled by
  it) and the output logits times 1.5 / 2; no branch multiplier."""
  model, params = init(**{'model.parametrization': 'mup', 'model.base_d_model': 8,
                          'model.output_mult': 1.5})
  params = jax.jit(perturb, static_argnames='seed')(params, seed=1)
  ref = jax.tree.map(lambda a: a, params)
  ref['blocks']['attn']['q'] = params['blocks']['attn']['q'] * (2 / 8) * math.sqrt(8)
  std = small_config()
  tokens = _tokens(std)
  a, b = _logits(model, params, tokens), _logits(make_model(std), ref, tokens)
  np.testing.assert_allclose(a, 0.75 * b, rtol=1e-5, atol=1e-5)


def test_mup_weight_decay_is_width_independent():
  """lr * lambda is constant in width on hidden matrices (lambda * m_N, LR / m_N)."""
  kw = {'model.parametrization': 'mup', 'model.base_d_model': 32, 'optim.weight_decay': 0.5}
  ups = [_first_update(_opt_cfg(**kw, **{'model.d_model': d}), 0.0) for d in (32, 64)]
  ps = [_params(_opt_cfg(**kw, **{'model.d_model': d})) for d in (32, 64)]
  for u, p in zip(ups, ps):  # zero gradient: the update is -lr * lambda_eff * p
    np.testing.assert_allclose(u['blocks']['mlp']['wo'], -3e-3 * 0.5 * p['blocks']['mlp']['wo'],
                               rtol=1e-5, atol=1e-12)


@covers('parametrization.PARAMETRIZATIONS', 'completep', 'depth_mup')
@pytest.mark.parametrize('kind,expect', [('completep', 0.5), ('depth_mup', 1 / math.sqrt(2))])
def test_depth_branch_multiplier(kind, expect):
  """L = 2 L_base: each branch is scaled by m_L^-alpha (CompleteP: L_base / L)."""
  cfg = tiny_config(**{'model.parametrization': kind, 'model.base_num_layers': 2,
                       'model.num_layers': 4})
  assert pz.branch_mult(cfg.model) == pytest.approx(expect)
  std = tiny_config(**{'model.num_layers': 4})
  params = _params(cfg)
  scaled = jax.tree.map(lambda a: a, params)  # F is linear in W_O and W_down
  scaled['blocks']['attn']['o'] = params['blocks']['attn']['o'] * expect
  scaled['blocks']['mlp']['wo'] = params['blocks']['mlp']['wo'] * expect
  tokens = _tokens(cfg)
  a, b = _logits(make_model(cfg), params, tokens), _logits(make_model(std), scaled, tokens)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('kind,alpha', [('completep', 1.0), ('depth_mup', 0.5)])
def test_depth_lr_and_epsilon_rules(kind, alpha):
  """Adam's first step with g << eps is lr * g / (g + eps_eff): recovers eps_eff per group;
  hidden LR carries m_N^-1 m_L^(alpha-1)."""
  kw = {'model.parametrization': kind, 'model.base_num_layers': 1, 'model.num_layers': 4,
        'model.base_d_model': 16, 'optim.eps': 1e-6}
  cfg = _opt_cfg(**kw)
  g, lr = 1e-6, cfg.optim.lr
  u = _first_update(cfg, g)
  m_n, m_l = 2.0, 4.0
  eps_block = 1e-6 / (m_n * m_l ** alpha)
  hidden_lr = lr / m_n * m_l ** (alpha - 1)
  np.testing.assert_allclose(np.abs(u['blocks']['mlp']['wi']), hidden_lr * g / (g + eps_block),
                             rtol=1e-4)
  np.testing.assert_allclose(np.abs(u['blocks']['mlp_norm']['scale']),
                             lr * m_l ** (alpha - 1) * g / (g + eps_block), rtol=1e-4)
  np.testing.assert_allclose(np.abs(u['final_norm']['scale']), lr * g / (g + 1e-6), rtol=1e-4)
  np.testing.assert_allclose(np.abs(u['embedding']), lr * g / (g + 1e-6), rtol=1e-4)


@covers('parametrization.INITS', 'depth_scaled')
def test_depth_scaled_and_small_init_stds():
  l, d = 4, 64
  p = _params(tiny_config(**{'model.init': 'depth_scaled', 'model.num_layers': l, 'model.d_model': d}))
  np.testing.assert_allclose(np.std(p['blocks']['mlp']['wo']), 0.02 / math.sqrt(2 * l), rtol=0.05)
  np.testing.assert_allclose(np.std(p['blocks']['attn']['q']), 0.02, rtol=0.05)
  p = _params(tiny_config(**{'model.init': 'small_init', 'model.d_model': d}))
  np.testing.assert_allclose(np.std(p['blocks']['attn']['q']), math.sqrt(2 / (5 * d)), rtol=0.05)


@covers('parametrization.INITS', 'xavier')
def test_xavier_init_stds():
  """Glorot normal std sqrt(2 / (fan_in + fan_out)) on every block matrix; embeddings keep init_std."""
  d = 64
  p = _params(tiny_config(**{'model.init': 'xavier', 'model.d_model': d}))
  np.testing.assert_allclose(np.std(p['blocks']['attn']['q']), math.sqrt(2 / (d + d)), rtol=0.05)
  np.testing.assert_allclose(np.std(p['blocks']['mlp']['wi']), math.sqrt(2 / (5 * d)), rtol=0.05)
  np.testing.assert_allclose(np.std(p['blocks']['mlp']['wo']), math.sqrt(2 / (5 * d)), rtol=0.05)
  np.testing.assert_allclose(np.std(p['embedding']), 0.02, rtol=0.05)


@covers('parametrization.INITS', 'deepnorm')
def test_deepnorm_init_gains():
  """xavier_normal with gain (8L)^-1/4 on V, O and the MLP, gain 1 on Q and K."""
  l, d = 4, 64
  p = _params(tiny_config(**{'model.init': 'deepnorm', 'model.num_layers': l, 'model.d_model': d}))
  beta = (8 * l) ** -0.25
  kv = p['blocks']['attn']['kv']
  np.testing.assert_allclose(np.std(kv[:, :, 0]), math.sqrt(2 / (d + d)), rtol=0.05)
  np.testing.assert_allclose(np.std(kv[:, :, 1]), beta * math.sqrt(2 / (d + d)), rtol=0.05)
  np.testing.assert_allclose(np.std(p['blocks']['mlp']['wi']), beta * math.sqrt(2 / (5 * d)), rtol=0.05)


def test_deepscalelm_residual_scaling_and_vo_init():
  """With zero branches each sublayer maps x -> lambda x (lambda^2 + beta^2 = 1, beta^2 = 1/L);
  V/O stds follow the correlation recursion (numpy float64 reference)."""
  l = 3
  cfg = tiny_config(**{'model.init': 'deepscalelm', 'model.num_layers': l, 'model.d_model': 64})
  params = _params(cfg)
  beta, lam = pz.dslm_beta_lambda(cfg.model)
  assert beta ** 2 == pytest.approx(1 / l) and lam ** 2 + beta ** 2 == pytest.approx(1)
  r, ref = 0.221, []
  for _ in range(l):
    ref.append((1 / r) ** 0.25 / math.sqrt(64))
    r = lam ** 2 * r + beta ** 2
    r = lam ** 2 * r + beta ** 2 * (r + (math.sqrt(1 - r * r) - r * math.acos(r)) / math.pi)
  o = np.asarray(params['blocks']['attn']['o'], np.float64)
  got = [np.std(o[i]) for i in range(l)]
  np.testing.assert_allclose(got, ref, rtol=0.08)
  np.testing.assert_allclose(np.std(params['embedding']), 1.0, rtol=0.05)
  params['blocks']['attn']['o'] = jnp.zeros_like(params['blocks']['attn']['o'])
  params['blocks']['mlp']['wo'] = jnp.zeros_like(params['blocks']['mlp']['wo'])
  model, tokens = make_model(cfg), _tokens(cfg)

  @jax.jit
  def embed_and_stack(params):
    x = model.apply({'params': params}, tokens, method=Transformer.embed)
    return x, model.apply({'params': params}, x, method=Transformer.stack)[0]

  x, out = embed_and_stack(params)
  np.testing.assert_allclose(out, lam ** (2 * l) * x, rtol=1e-5, atol=1e-6)


def _relu_correlation(r: float, points: int = 200) -> float:
  """E[relu(u) relu(v)] / E[relu(u)^2] for standard normals of correlation r, by 2-D
  Gauss-Hermite quadrature (independent of the closed form the init uses)."""
  z, w = np.polynomial.hermite_e.hermegauss(points)
  w = w / w.sum()
  u, v = z[:, None], r * z[:, None] + math.sqrt(1 - r * r) * z[None, :]
  return float(np.sum(w[:, None] * w[None, :] * np.maximum(u, 0) * np.maximum(v, 0)) / 0.5)


def _matrix_stds(params) -> dict[str, np.ndarray]:
  """Per-layer sample std of every block matrix (k and v split out of kv), and the embedding."""
  b = params['blocks']
  mats = {'q': b['attn']['q'], 'k': b['attn']['kv'][:, :, 0], 'v': b['attn']['kv'][:, :, 1],
          'o': b['attn']['o'], 'wi': b['mlp']['wi'], 'wo': b['mlp']['wo']}
  out = {k: np.std(np.asarray(m, np.float64).reshape(m.shape[0], -1), axis=1)
         for k, m in mats.items()}
  out['embedding'] = np.std(np.asarray(params['embedding'], np.float64))
  return out


@covers('parametrization.INITS', 'normal', 'small_init', 'deepscalelm')
@pytest.mark.parametrize('scheme', ['normal', 'small_init', 'deepscalelm'])
def test_init_stds_of_every_matrix_and_layer(scheme):
  """normal: init_std everywhere; small_init (Nguyen & Salazar): sqrt(2 / 5D) on every matrix;
  DeepScaleLM: q, k 1/sqrt(D), FFN var sqrt(2 / (D F)), unit embedding, and V, O of layer l
  var sqrt(1 / r_l) / D with r_l carried from the paper's r_0 = 0.221 through attention
  (lambda^2 r + beta^2) and the ReLU FFN (lambda^2 r + beta^2 rho(r), rho by quadrature)."""
  l, d, f = 3, 64, 256
  cfg = tiny_config(**{'model.init': scheme, 'model.num_layers': l, 'model.d_model': d})
  stds = _matrix_stds(_params(cfg))
  if scheme == 'normal':
    ref = {k: 0.02 for k in stds}
  elif scheme == 'small_init':
    ref = {k: math.sqrt(2 / (5 * d)) for k in stds}
  else:
    beta2 = 1 / l
    r, vo = 0.221, []
    for _ in range(l):
      vo.append(math.sqrt(math.sqrt(1 / r) / d))
      r = (1 - beta2) * r + beta2
      r = (1 - beta2) * r + beta2 * _relu_correlation(r)
    ref = {'q': d ** -0.5, 'k': d ** -0.5, 'v': np.array(vo), 'o': np.array(vo),
           'wi': (2 / (d * f)) ** 0.25, 'wo': (2 / (d * f)) ** 0.25, 'embedding': 1.0}
    init_std = jax.jit(lambda layer: pz.init_std(cfg.model, 'o', d, d, layer))
    for i in range(l):  # the exact stds the init draws with
      got = float(init_std(jnp.int32(i + 1)))
      assert got == pytest.approx(vo[i], rel=1e-3)  # quadrature error ~1e-4
  for name, std in stds.items():
    np.testing.assert_allclose(std, np.broadcast_to(ref[name], np.shape(std)), rtol=0.05,
                               err_msg=name)


@pytest.mark.parametrize('block', ['deepnorm', 'sub_ln', 'hybridnorm', 'hybridnorm_star',
                                   'simple_norm'])
def test_placement_init_composes_with_the_width_factor(block):
  """A placement's own init scheme times muP's m_N^-1/2 on hidden matrices: at twice the base
  width every hidden std is 1/sqrt(2) of the standard parametrization's, the rest unchanged."""
  over = {'model.block': block, 'model.d_model': 64, 'model.num_heads': 2, 'model.mlp': 'swiglu'}
  sp = _params(tiny_config(**over))
  mup = _params(tiny_config(**over, **{'model.parametrization': 'mup', 'model.base_d_model': 32}))
  for path in (('attn', 'q'), ('attn', 'kv'), ('attn', 'o'), ('mlp', 'wi'), ('mlp', 'wo')):
    w_sp, w_mup = (p['blocks'][path[0]][path[1]] for p in (sp, mup))
    np.testing.assert_allclose(np.std(w_mup) / np.std(w_sp), 2 ** -0.5, rtol=0.03, err_msg=str(path))
  np.testing.assert_allclose(np.std(mup['embedding']), np.std(sp['embedding']), rtol=0.03)


def test_a_second_init_scheme_with_a_placement_that_has_one_is_refused():
  with pytest.raises(ConfigError, match=r"model.init='xavier' is invalid: allowed 'normal' or "
                                        r"'deepnorm' with model.block=deepnorm"):
    validate(tiny_config(**{'model.block': 'deepnorm', 'model.init': 'xavier'}))
  validate(tiny_config(**{'model.block': 'deepnorm', 'model.init': 'deepnorm'}))
  with pytest.raises(ConfigError, match=r"model.init='small_init' is invalid: allowed 'normal' "
                                        r'with model.block=sub_ln'):
    validate(tiny_config(**{'model.block': 'sub_ln', 'model.init': 'small_init'}))


@pytest.mark.parametrize('scheme', sorted(pz.INITS))
def test_an_init_that_scales_the_skip_needs_a_plain_stream_as_its_row_says(scheme):
  """A row's `scales_skip` is its skip multiplier (DeepScaleLM's lambda); such an init fails
  in one line with a residual design that is not plain or a parallel block, others validate."""
  cfg = tiny_config(**{'model.init': scheme})
  assert pz.INITS[scheme].scales_skip == (pz.skip_mult(cfg.model) != 1.0)
  others = ', '.join(i for i, row in pz.INITS.items() if not row.scales_skip)
  for over, rest in (({'model.residual': 'laurel'}, r'model.residual=laurel \(its skip '
                                                    r'multiplier needs model.residual in standard\)'),
                     ({'model.parallel_block': 'gptj'}, 'model.parallel_block=gptj')):
    validates_unless(pz.INITS[scheme].scales_skip, tiny_config(**{'model.init': scheme, **over}),
                     rf"^model.init='{scheme}' is invalid: allowed one of {others} with {rest}$")
