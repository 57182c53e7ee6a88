"""Training dynamics (ProRes, BranchNorm, LayerDrop, LayerSkip, Q/K slow-down, LLR) by their
defining properties, and (slow tier) every training-dynamics method lowers the held-out loss in
20 steps."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale import config, data
from depthscale.model import placements
from depthscale.model.transformer import Transformer, apply_unrolled, make_model
from depthscale.training import dynamics, llr
from depthscale.training.optim import lr_multipliers, make_optimizer, schedule
from depthscale.training.steps import early_exit_weights, init_state, make_train_step, model_loss
from tests.helpers import (batch_loss, covers, heldout_batch, init, perturb, run_block, small_config,
                           tiny_config, tokens)


@functools.partial(jax.jit, static_argnums=0)
def _init(model):
  """init_state's parameters, one compiled program per model (equal models share it)."""
  return init_state(model, optax.identity(), 0, model.max_len)['params']


def _setup(cfg):
  model = make_model(cfg)
  params = _init(model)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)
  return model, params, tokens


def test_prores_step0_every_block_is_identity_and_later_not():
  cfg = tiny_config(**{'train.prores': 'linear', 'train.prores_warmup_steps': 30})
  model, params, tokens = _setup(cfg)
  apply = jax.jit(model.apply)
  head = jax.jit(lambda p: model.apply(
      {'params': p}, model.apply({'params': p}, tokens, method=Transformer.embed),
      method=Transformer.unembed))(params)
  at0 = dynamics.layer_inputs(cfg, 0, jax.random.PRNGKey(0), 2, True)
  np.testing.assert_allclose(apply({'params': params}, tokens, at0)[0], head, rtol=0, atol=1e-6)
  at5 = dynamics.layer_inputs(cfg, 5, jax.random.PRNGKey(0), 2, True)
  assert np.abs(np.asarray(apply({'params': params}, tokens, at5)[0] - head)).max() > 1e-4


def test_prores_schedules():
  cfg = tiny_config(**{'train.prores': 'linear', 'train.prores_warmup_steps': 30})
  ends = np.linspace(10, 30, 3)  # linspace(W // L, W, L)
  for t in (0, 7, 15, 29):
    np.testing.assert_allclose(dynamics.prores_alpha(cfg, t), np.clip(t / ends, 0, 1), rtol=1e-6)
  np.testing.assert_array_equal(dynamics.prores_alpha(cfg, 30), np.ones(3))
  cfg.train.prores = 'reverse'
  np.testing.assert_allclose(dynamics.prores_alpha(cfg, 10), [1 / 3, 0.5, 1.0], rtol=1e-6)
  cfg.train.prores = 'square'
  np.testing.assert_allclose(dynamics.prores_alpha(cfg, 5), (5 / ends) ** 2, rtol=1e-6)
  cfg.train.prores, cfg.train.prores_value = 'stagewise', 'inv_L'
  np.testing.assert_allclose(dynamics.prores_alpha(cfg, 15), [1, 1 / 3 + 2 / 3 * 0.5, 1 / 3], rtol=1e-6)
  cfg.train.prores, cfg.train.prores_value = 'fix', 'inv_sqrt_l'
  np.testing.assert_allclose(dynamics.prores_alpha(cfg, 3), 1 / np.sqrt([1, 2, 3]), rtol=1e-6)


def _bn_reference(f, a, eps):
  """BN_t(F) in float64 (the reconstruction): (F - mean) / (var + eps)^((1 - a)/2)."""
  f = np.asarray(f, np.float64)
  c = f - f.mean(-1, keepdims=True)
  return c / (np.square(c).mean(-1, keepdims=True) + eps) ** ((1 - a) / 2)


def test_branchnorm_normalizes_the_branch_at_step0_and_is_post_ln_after_T():
  """Block level: the sublayer's update before the norm is BN_t(F) (float64 reference): unit
  variance per token at t = 0, only centered for t >= T. Model level: t >= T equals Post-LN
  with the same parameters; scanned = unrolled with the step's inputs."""
  cfg = tiny_config(**{'model.block': 'branchnorm', 'train.branchnorm_steps': 10})
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 32))
  for t, a in ((0, 0.0), (4, 0.4), (10, 1.0), (25, 1.0)):
    layer = {'branchnorm_a': placements.branchnorm_a(cfg, t)[0]}
    sub = placements.Sublayer('attn', lambda h: 3.0 * h + 1.0, lambda role: (lambda y: y), layer,
                          cfg.model)
    update = np.asarray(placements.branchnorm(x, sub) - x)
    np.testing.assert_allclose(update, _bn_reference(3.0 * x + 1.0, a, cfg.model.norm_eps),
                               rtol=1e-5, atol=1e-5)
    if t == 0:
      np.testing.assert_allclose(update.mean(-1), 0, atol=1e-5)
      np.testing.assert_allclose(update.var(-1), 1, rtol=1e-3)
  model, params, tokens = _setup(cfg)
  post, _ = jax.jit(make_model(tiny_config(**{'model.block': 'post_ln'})).apply)(
      {'params': params}, tokens)
  both = jax.jit(lambda p, i: (model.apply({'params': p}, tokens, i)[0],  # one program
                               apply_unrolled(model, p, tokens, i)))
  for t in (0, 5, 10, 15):
    logits, unrolled = both(params, dynamics.layer_inputs(cfg, t, jax.random.PRNGKey(0), 2, False))
    np.testing.assert_allclose(unrolled, logits, atol=1e-5)
    if t >= 10:
      np.testing.assert_allclose(logits, post, rtol=1e-5, atol=1e-5)
    else:
      assert np.abs(np.asarray(logits - post)).max() > 1e-3
  for field, value in (('train.branchnorm_steps', 0), ('model.norm', 'rmsnorm')):
    with pytest.raises(config.ConfigError, match=field):
      config.validate(tiny_config(**{'model.block': 'branchnorm', 'train.branchnorm_steps': 10,
                                     field: value}))


def test_layerdrop_p0_equals_base_and_a_dropped_block_is_skipped():
  cfg = tiny_config()
  model, params, tokens = _setup(cfg)
  apply = jax.jit(model.apply)
  base, _ = apply({'params': params}, tokens)
  cfg.train.layerdrop = 0.0
  assert dynamics.layer_inputs(cfg, 3, jax.random.PRNGKey(0), 2, True) is None
  cfg.train.layerdrop = 0.5  # a mask with block 2 dropped equals the model without block 2
  masks = [np.asarray(dynamics.layer_inputs(cfg, t, jax.random.PRNGKey(0), 2, True)['branch_mult'])
           for t in range(40)]
  assert set(np.unique(np.concatenate(masks))) == {0.0, 1.0}
  assert 0.3 < np.mean(masks) < 0.7
  dropped, _ = apply({'params': params}, tokens, {'branch_mult': jnp.array([1.0, 0.0, 1.0])})
  two = make_model(tiny_config(**{'model.num_layers': 2}))
  kept = lambda p: dict(p, blocks=jax.tree.map(lambda a: a[jnp.array([0, 2])], p['blocks']))
  ref, _ = jax.jit(lambda p: two.apply({'params': kept(p)}, tokens))(params)
  np.testing.assert_allclose(dropped, ref, rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(dropped - base)).max() > 1e-4
  assert dynamics.layer_inputs(cfg, 3, jax.random.PRNGKey(0), 2, False) is None or np.all(
      dynamics.layer_inputs(cfg, 3, jax.random.PRNGKey(0), 2, False)['branch_mult'] == 1)


def test_layerskip_rates_and_exit_weights():
  cfg = tiny_config(**{'train.layerskip_p_max': 0.2, 'train.steps': 11, 'model.num_layers': 4})
  rates = np.asarray(dynamics.layerskip_rates(cfg, 10))  # S(T-1) = 1
  np.testing.assert_allclose(rates, 0.2 * (np.exp(np.arange(4) * math.log(2) / 3) - 1), rtol=1e-6)
  assert rates[0] == 0 and rates[-1] == pytest.approx(0.2)
  np.testing.assert_array_equal(dynamics.layerskip_rates(cfg, 0), np.zeros(4))
  w = np.asarray(early_exit_weights(4, 0.5))
  e = np.array([0, 0.5 * 1, 0.5 * 3, 3 + 0.5 * 3])
  np.testing.assert_allclose(w, e / e.sum(), rtol=1e-6)
  mask = dynamics.layer_inputs(cfg, 10, jax.random.PRNGKey(0), 8, True)['branch_mult']
  assert mask.shape == (4, 8) and np.all(np.asarray(mask[0]) == 1)


def test_qk_slowdown_factor_and_optimizer():
  cfg = tiny_config(**{'optim.qk_slow_factor': 0.1, 'optim.qk_slow_steps': 10,
                       'optim.qk_slow_ramp': 10, 'model.num_layers': 4})
  np.testing.assert_allclose(dynamics.qk_slow_factor(cfg, 5), [1, 1, 0.1, 0.1], rtol=1e-6)
  np.testing.assert_allclose(dynamics.qk_slow_factor(cfg, 15), [1, 1, 0.55, 0.55], rtol=1e-6)
  np.testing.assert_allclose(dynamics.qk_slow_factor(cfg, 20), [1, 1, 1, 1], rtol=1e-6)
  _, params, _ = _setup(cfg)
  m = jax.jit(lambda p: lr_multipliers(cfg, 0, p))(params)
  np.testing.assert_allclose(np.ravel(m['blocks']['attn']['q']), [1, 1, 0.1, 0.1], rtol=1e-6)
  kv = np.broadcast_to(m['blocks']['attn']['kv'], params['blocks']['attn']['kv'].shape)
  assert np.all(kv[2:, :, 0] == np.float32(0.1)) and np.all(kv[:, :, 1] == 1) and np.all(kv[:2] == 1)
  assert np.all(np.asarray(m['blocks']['attn']['o']) == 1)


def test_layerskip_mask_drops_a_block_for_its_sample_only():
  """A per-sample keep mask (L, B) = [[0, 1], [1, 1]]: sample 1 skips block 1 (the identity
  under Pre-LN), sample 2 runs every block; a Python loop per sample, params off init."""
  model, params = init()
  params = jax.jit(perturb)(params, 6)
  toks = tokens(small_config())
  mask = jnp.array([[0.0, 1.0], [1.0, 1.0]])
  got, _ = jax.jit(model.apply)({'params': params}, toks, {'branch_mult': mask})
  keep = np.asarray(mask)  # concrete: the reference's Python loop reads it

  @jax.jit
  def reference(params):  # per sample: its kept blocks in a Python loop
    refs = []
    for b in range(2):
      x = model.apply({'params': params}, toks[b:b + 1], method=Transformer.embed)
      for l in range(2):
        x = run_block(model, params, x, l) if keep[l, b] else x
      refs.append(model.apply({'params': params}, x, method=Transformer.unembed))
    return refs

  for b, ref in enumerate(reference(params)):
    np.testing.assert_allclose(got[b:b + 1], ref, rtol=1e-5, atol=1e-5, err_msg=f'sample {b}')


def test_qk_slowdown_inside_the_optimizer_follows_the_step_count():
  """Adam's update for a constant gradient is lr * sign(g): the slowed layers' (3, 4) W_Q and
  keys step by lr * [0.1, 0.1, 0.1, 0.55, 1] at steps 0-4 (c = 0.1, 2 steps, 2-step ramp);
  values and layers 1, 2 by lr throughout."""
  cfg = tiny_config(**{'optim.qk_slow_factor': 0.1, 'optim.qk_slow_steps': 2,
                       'optim.qk_slow_ramp': 2, 'model.num_layers': 4, 'optim.schedule': 'constant',
                       'optim.warmup_steps': 0, 'optim.weight_decay': 0.0, 'optim.clip_norm': 0.0})
  _, params, _ = _setup(cfg)
  tx, lr = make_optimizer(cfg), cfg.optim.lr
  grads = jax.tree.map(jnp.ones_like, params)
  update = jax.jit(tx.update)
  state = tx.init(params)
  for factor in (0.1, 0.1, 0.1, 0.55, 1.0):
    u, state = update(grads, state, params)
    q, kv = np.abs(u['blocks']['attn']['q']), np.abs(u['blocks']['attn']['kv'])
    for got, slowed in ((q, q[2:]), (kv[:, :, 0], kv[2:, :, 0])):
      np.testing.assert_allclose(slowed, lr * factor, rtol=1e-4)
      np.testing.assert_allclose(got[:2], lr, rtol=1e-4)
    np.testing.assert_allclose(kv[:, :, 1], lr, rtol=1e-4)


def _hill_numpy(eigs):
  eigs = np.sort(np.asarray(eigs, np.float64))
  i0 = len(eigs) // 2
  return 1 + (len(eigs) - i0) / np.sum(np.log(eigs[i0:] / eigs[i0]))


@pytest.mark.parametrize('alpha', [2.5, 4.0])
def test_llr_hill_estimator_recovers_power_law_exponent(alpha):
  """Eigenvalues from a Pareto density ~ lambda^-alpha: float32 Hill vs a float64 reference
  and vs the true exponent; the same through the ESD of a matrix with those spectra."""
  rng = np.random.default_rng(0)
  eigs = (1 - rng.random(4000)) ** (-1 / (alpha - 1))
  got = float(llr.hill_alpha(jnp.sort(jnp.asarray(eigs, jnp.float32))))
  assert got == pytest.approx(_hill_numpy(eigs), rel=1e-4)
  assert got == pytest.approx(alpha, rel=0.06)
  n = 256
  sv = np.sqrt((1 - rng.random(n)) ** (-1 / (alpha - 1)))
  u, _ = np.linalg.qr(rng.standard_normal((n, n)))
  v, _ = np.linalg.qr(rng.standard_normal((n, n)))
  w = (u * sv) @ v.T
  esd = np.asarray(llr.esd(jnp.asarray(w, jnp.float32)), np.float64)
  assert float(llr.hill_alpha(jnp.asarray(esd))) == pytest.approx(_hill_numpy(sv ** 2), rel=1e-2)


def test_llr_targets_map_alpha_linearly():
  cfg = tiny_config(**{'optim.llr': True, 'optim.llr_min': 1.0, 'optim.llr_max': 3.0})
  _, params, _ = _setup(cfg)
  modules = (('attn', 'q'), ('attn', 'kv'), ('attn', 'o'), ('mlp', 'wi'), ('mlp', 'wo'))
  m, module_alphas = jax.jit(lambda p: (llr.target_multipliers(cfg, p), [
      llr.module_alphas(n, p['blocks'][s][n]) for s, n in modules]))(params)
  vals = np.concatenate([np.ravel(m['blocks'][s][n]) for s, n in modules])
  assert vals.min() == pytest.approx(1.0) and vals.max() == pytest.approx(3.0)
  assert float(m['embedding']) == 3.0 and float(m['final_norm']['scale']) == 1.0
  alphas = np.concatenate([np.ravel(a) for a in module_alphas])
  lo, hi = alphas.min(), alphas.max()  # exactly linear: 1 + 2 (alpha - min) / (max - min)
  np.testing.assert_allclose(vals, 1 + 2 * (alphas - lo) / (hi - lo), rtol=1e-5)


METHODS = {
    'mup+small_init+qk_slow': {'model.parametrization': 'mup', 'model.base_d_model': 16,
                               'model.init': 'small_init', 'optim.qk_slow_factor': 0.1,
                               'optim.qk_slow_steps': 5, 'optim.qk_slow_ramp': 5},
    'depth_mup+depth_scaled+prores+layerdrop': {
        'model.parametrization': 'depth_mup', 'model.base_num_layers': 1,
        'model.init': 'depth_scaled', 'train.prores': 'sqrt', 'train.prores_warmup_steps': 10,
        'train.layerdrop': 0.2},
    'completep+deepnorm+layerskip': {
        'model.parametrization': 'completep', 'model.base_num_layers': 1,
        'model.base_d_model': 16, 'model.init': 'deepnorm', 'train.layerskip_p_max': 0.2,
        'train.early_exit_scale': 0.2},
    'branchnorm': {'model.block': 'branchnorm', 'train.branchnorm_steps': 10},
    'deepscalelm+llr': {'model.init': 'deepscalelm', 'optim.llr': True, 'optim.llr_every': 5,
                        'optim.llr_fraction': 0.5, 'optim.llr_transition_steps': 3},
}


@pytest.mark.slow  # 20 training steps per method
@pytest.mark.parametrize('name', list(METHODS))
def test_trains_20_steps_and_lowers_the_heldout_loss(name):
  cfg = tiny_config(**{'model.num_layers': 2, 'train.steps': 20, **METHODS[name]})
  model, tx = make_model(cfg), make_optimizer(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, 0, cfg.data.seq_len)
  init_params = state['params']
  step = jax.jit(make_train_step(model, tx, schedule(cfg), cfg))
  it = data.train_iterator(cfg.data, 0)
  losses = []
  for _ in range(20):
    state, out = step(state, next(it))
    assert bool(out['ok'])
    losses.append(float(out['loss']))
  assert np.all(np.isfinite(losses))
  # held-out loss drop, measured 0.38 (completep+deepnorm+layerskip) to 11.5 nats; Pre-LN 0.76
  loss = batch_loss(model, heldout_batch(cfg))
  drop = loss(init_params) - loss(state['params'])
  assert drop > 0.2, drop


def _prores_reference(kind: str, value: str, t: float, w: int, n: int) -> np.ndarray:
  """ProRes alpha_l(t) from the paper's formulas, layer l (1-based) done at T_l = W l / L
  (T_l = W for 'equal', reversed order for 'reverse'); 1 once t >= W."""
  l = np.arange(1, n + 1, dtype=np.float64)
  ends = np.linspace(w // n, w, n)
  ends = {'equal': np.full(n, float(w)), 'reverse': ends[::-1]}.get(kind, ends)
  floor = {'zero': np.zeros(n), 'inv_L': np.full(n, 1 / n), 'inv_sqrt_L': np.full(n, n ** -0.5),
           'inv_sqrt_l': l ** -0.5}[value]
  ramp = np.clip(t / ends, 0, 1)
  starts = np.concatenate([[0.0], ends[:-1]])
  alpha = {'none': np.ones(n), 'linear': ramp, 'equal': ramp, 'reverse': ramp, 'sqrt': np.sqrt(ramp),
           'square': ramp ** 2, 'fix': floor}.get(kind)
  if kind == 'stagewise':  # from the floor at the previous layer's end to 1 at its own
    alpha = np.clip(floor + (1 - floor) * (t - starts) / (ends - starts), floor, 1)
  return np.ones(n) if t >= w else alpha


@covers('dynamics.PRORES', *dynamics.PRORES)
@covers('dynamics.PRORES_VALUES', *dynamics.PRORES_VALUES)
@pytest.mark.parametrize('kind', dynamics.PRORES)
def test_every_prores_schedule_follows_its_formula(kind):
  """Every schedule, with every floor / constant where it takes one, at steps across W."""
  values = dynamics.PRORES_VALUES if kind in ('stagewise', 'fix') else ('zero',)
  for value in values:
    cfg = tiny_config(**{'model.num_layers': 4, 'train.prores': kind,
                         'train.prores_warmup_steps': 40, 'train.prores_value': value})
    for t in (0, 3, 10, 17, 25, 39, 40, 55):
      np.testing.assert_allclose(dynamics.prores_alpha(cfg, t),
                                 _prores_reference(kind, value, t, 40, 4), rtol=1e-6, atol=1e-7,
                                 err_msg=f'{kind} {value} t={t}')


@covers('dynamics.LAYERSKIP_CURRICULA', 'exp', 'none')
def test_layerskip_curricula_exp_ramps_in_time_and_none_is_constant():
  """p_l(t) = S(t) D(l) p_max: S(t) = 2^(t / (T - 1)) - 1 ('exp') or 1 ('none')."""
  base = {'train.layerskip_p_max': 0.3, 'train.steps': 9, 'model.num_layers': 4}
  depth = 0.3 * (2.0 ** (np.arange(4) / 3) - 1)
  for t in (0, 4, 8):
    exp = dynamics.layerskip_rates(tiny_config(**base), t)
    np.testing.assert_allclose(exp, (2.0 ** (t / 8) - 1) * depth, rtol=1e-5, atol=1e-7)
    none_cfg = tiny_config(**{**base, 'train.layerskip_curriculum': 'none'})
    none = dynamics.layerskip_rates(none_cfg, t)
    np.testing.assert_allclose(none, depth, rtol=1e-6)


def test_early_exit_loss_is_the_weighted_sum_of_per_layer_exit_losses():
  """LayerSkip: sum_l e_l CE(head(FinalNorm(h_l))) over layers l < L plus e_L CE(model), each
  exit computed by a separate forward pass truncated after block l (no drops: p_max = 0)."""
  cfg = tiny_config(**{'train.early_exit_scale': 0.7, 'data.seq_len': 32})
  model, params, tokens = _setup(cfg)
  batch = {'inputs': tokens, 'targets': jnp.roll(tokens, -1, axis=1),
           'weights': jnp.ones(tokens.shape, jnp.float32).at[:, -3:].set(0.0)}
  loss, _ = jax.jit(lambda p: model_loss(model, cfg, p, batch, 0, jax.random.PRNGKey(0)))(params)

  def ce(logits):
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1)
    nll = -np.take_along_axis(np.asarray(logp), np.asarray(batch['targets'])[..., None], -1)[..., 0]
    return float((nll * batch['weights']).sum() / batch['weights'].sum())

  n = cfg.model.num_layers

  @jax.jit
  def exit_logits(params):  # the model truncated to blocks 1..l, each l
    outs = []
    for l in range(1, n + 1):
      short = make_model(tiny_config(**{'model.num_layers': l, 'data.seq_len': 32}))
      kept = dict(params, blocks=jax.tree.map(lambda a, l=l: a[:l], params['blocks']))
      outs.append(short.apply({'params': kept}, tokens)[0])
    return outs

  exits = [ce(logits) for logits in exit_logits(params)]
  w = np.asarray(early_exit_weights(n, 0.7), np.float64)
  assert loss == pytest.approx(float(np.dot(w, exits)), rel=1e-5)
  assert abs(exits[0] - exits[-1]) > 1e-3  # the exits differ: the weights matter


def test_layerdrop_masks_are_redrawn_every_step_at_rate_p_per_layer():
  """Fan et al.: an independent draw per layer and step; each layer drops at rate ~p."""
  cfg = tiny_config(**{'train.layerdrop': 0.3, 'model.num_layers': 6})
  masks = np.stack([np.asarray(dynamics.layer_inputs(cfg, t, jax.random.PRNGKey(0), 2,
                                                     True)['branch_mult']) for t in range(400)])
  assert len({m.tobytes() for m in masks}) > 30  # 2^6 patterns: not one mask repeated
  np.testing.assert_allclose(1 - masks.mean(0), 0.3, atol=0.08)  # 4.5 sigma at n = 400
  same = np.mean(masks[1:] == masks[:-1])
  assert same == pytest.approx(0.7 ** 2 + 0.3 ** 2, abs=0.05)  # consecutive steps independent


def test_llr_multipliers_follow_the_recompute_and_transition_schedule():
  """scale_by_llr: at steps c with c % every == 0 and c <= fraction * steps the targets are
  recomputed from the current params and reached linearly over transition_steps; frozen
  after. Reference: a Python replay with llr.target_multipliers."""
  cfg = tiny_config(**{'optim.llr': True, 'optim.llr_every': 3, 'optim.llr_transition_steps': 2,
                       'optim.llr_fraction': 0.35, 'train.steps': 20})
  _, params, _ = _setup(cfg)
  tx = llr.scale_by_llr(cfg)
  state = tx.init(params)
  ones = jax.tree.map(jnp.ones_like, params)
  update = jax.jit(tx.update)
  targets = jax.jit(lambda p: llr.target_multipliers(cfg, p))
  noisy = jax.jit(lambda c: jax.tree.map(  # new weights: new targets at recomputes
      lambda a: a * (1 + 0.5 * jax.random.normal(jax.random.PRNGKey(c), a.shape)), params))
  start = target = jax.tree.map(lambda m: np.ones(np.shape(m)), jax.eval_shape(targets, params))
  since = 0
  for c in range(12):
    p = noisy(c)
    frac = lambda: min(max((c - since) / 2, 0.0), 1.0)
    if c % 3 == 0 and c <= 7:
      now = jax.tree.map(lambda s, t: s + (t - s) * frac(), start, target)
      start, target, since = now, jax.tree.map(np.asarray, targets(p)), c
    ref = jax.tree.map(lambda s, t: s + (t - s) * frac(), start, target)
    got, state = update(ones, state, p)
    np.testing.assert_allclose(np.ravel(got['blocks']['attn']['q']),
                               np.ravel(np.broadcast_to(ref['blocks']['attn']['q'],
                                                        params['blocks']['attn']['q'].shape)),
                               rtol=1e-5, err_msg=f'step {c}')
