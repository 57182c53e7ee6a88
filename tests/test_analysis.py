"""Periodic analyses against float64 numpy on a tiny Pre-LN model whose block 2 has zero
branches (the identity): its skip loss, Jacobian deviation and angular distance are 0.
Then every residual design and the step-dependent schedules (mid-ProRes, BranchNorm before
T) against a Python loop over blocks: the analysed model is the one being trained."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model import ops, residual
from depthscale.model.placements import layer_schedule
from depthscale.model.transformer import Block, Transformer, make_model, scan_inputs
from depthscale.training import analysis, dynamics, loop, sharding
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state
from tests.helpers import covers, perturb, small_config, tiny_config

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


@functools.partial(jax.jit, static_argnums=(0, 3))
def _apply(model, params, x, method):
  """One method of the model (embed, start, finish, unembed), one program per shape."""
  return model.apply({'params': params}, x, method=method)


@functools.partial(jax.jit, static_argnums=0)
def _block(model, blocks, carry, schedule, l):
  """Block l (0-based) of the stacked blocks on carry, its new carry; l is traced, so one
  program serves every layer."""
  row = lambda a: a[l]
  return Block(model.cfg).apply({'params': jax.tree.map(row, blocks)}, carry,
                                jax.tree.map(row, schedule))[0]


@jax.jit
def _rotated(init, noise):
  """init + 0.5 noise (rotated away from init), block ZERO's branch outputs zeroed."""
  params = jax.tree.map(lambda a, b: a + 0.5 * b, init, noise)
  for sub, name in (('attn', 'o'), ('mlp', 'wo')):
    params['blocks'][sub][name] = params['blocks'][sub][name].at[ZERO].set(0.0)
  return params


@pytest.fixture(scope='module')
def analysed():
  cfg = tiny_config(**{'model.block': 'pre_ln'})
  model, tx = make_model(cfg), make_optimizer(cfg)
  params_of = jax.jit(lambda seed: init_state(model, tx, seed, cfg.data.seq_len)['params'])
  init = params_of(0)
  params = _rotated(init, params_of(1))
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, cfg.data.seq_len + 1), 0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': jnp.ones((2, cfg.data.seq_len), jnp.float32)}
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  layers, scalars = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0)(params)
  return cfg, model, init, params, batch, layers, scalars


def _streams(cfg, model, params, batch, skip=None):
  """h_0..h_L by a Python loop over blocks (the reference), block `skip` left out."""
  sched = layer_schedule(model.cfg)
  hs = [_apply(model, params, batch['inputs'], Transformer.embed)]
  for l in range(cfg.model.num_layers):
    x = _block(model, params['blocks'], {'x': hs[-1]}, sched, l)['x']
    hs.append(hs[-1] if l == skip else x)
  return hs


def _loss64(model, params, h, batch):
  logp = _log_softmax64(_apply(model, params, h, Transformer.unembed))
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

  logp = [_log_softmax64(_apply(model, params, h, Transformer.unembed)) for h in hs[1:]]
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

  vec = lambda t, l: np.concatenate([np.asarray(w, np.float64)[l].ravel()
                                     for w in jax.tree.leaves(t['blocks']) if w.ndim >= 3])
  rot = [1 - vec(params, l) @ vec(init, l) / np.linalg.norm(vec(params, l)) / np.linalg.norm(vec(init, l))
         for l in range(L)]
  np.testing.assert_allclose(layers['param_rotation'], rot, rtol=1e-6)

  ent = np.array([_entropies64(model, params, hs[l], l) for l in range(L)])  # L x H
  np.testing.assert_allclose(layers['attn_entropy_mean'], ent.mean(1), rtol=1e-4)
  np.testing.assert_allclose(layers['attn_entropy_min'], ent.min(1), rtol=1e-4)

  keys = jax.random.split(jax.random.PRNGKey(0), L)  # the Analyzer's v per block (seed 0)
  sched = layer_schedule(model.cfg)
  for l in range(L):
    block = lambda x, l=l: _block(model, params['blocks'], {'x': x}, sched, l)['x']
    v = jax.random.normal(jax.random.split(keys[l], 1)[0], hs[l].shape)
    eps = 1e-3 * float(jnp.sqrt(jnp.mean(hs[l] ** 2)))  # central difference, small vs x
    jv = (np.asarray(block(hs[l] + eps * v), np.float64) - block(hs[l] - eps * v)) / (2 * eps)
    v64 = np.asarray(v, np.float64)
    dev = np.linalg.norm(jv - v64) / np.linalg.norm(v64)
    assert layers['jacobian_identity_dev'][l] == pytest.approx(dev, rel=1e-2, abs=1e-4)


def _rope64(x, base=10000.0):
  t, e = x.shape[1], x.shape[-1]
  angle = np.arange(t)[:, None] * base ** (-np.arange(0, e, 2) / e)[None]
  cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
  x1, x2 = x[..., :e // 2], x[..., e // 2:]
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _entropies64(model, params, x, l):
  """Per head: mean over sequences and queries of the causal attention entropy of block l
  (Pre-LN: q, k of LN(x), RoPE, logits q.k / sqrt(E)), float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64)[l], params['blocks'])
  x = np.asarray(x, np.float64)
  n = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + model.cfg.norm_eps)
  n = n * p['attn_norm']['scale'] + p['attn_norm']['bias']
  q = _rope64(np.einsum('btd,dhe->bthe', n, p['attn']['q']))
  k = _rope64(np.einsum('btd,dhe->bthe', n, p['attn']['kv'][:, 0]))
  logits = np.einsum('bihe,bjhe->bhij', q, k) / np.sqrt(q.shape[-1])
  t = x.shape[1]
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  plogp = np.exp(logp) * np.where(np.isfinite(logp), logp, 0.0)
  return -plogp.sum(-1).mean((0, 2))


def _perturbed(cfg, seed: int):
  """(model, init params, init params plus 0.1 N(0, 1) on every leaf: mixing weights and gates
  away from init)."""
  model, tx = make_model(cfg), make_optimizer(cfg)
  params = jax.jit(lambda: init_state(model, tx, 0, cfg.data.seq_len)['params'])()
  return model, params, perturb(params, seed)


def _loop(model, params, inputs, schedule, skip=None):
  """(stream view after each block, final logits) by a Python loop over blocks; block `skip`
  (0-based) leaves the whole carry unchanged."""
  design = residual.DESIGNS[model.cfg.residual]
  apply = lambda x, method: _apply(model, params, x, method)
  carry = apply(apply(inputs, Transformer.embed), Transformer.start)
  views = [design.view(carry)]
  for l in range(model.cfg.num_layers):
    if l != skip:
      carry = _block(model, params['blocks'], carry, schedule, l)
    views.append(design.view(carry))
  return views, apply(apply(carry, Transformer.finish), Transformer.unembed)


def _ce64(logits, batch):
  logp = _log_softmax64(logits)
  return -np.take_along_axis(logp, np.asarray(batch['targets'])[..., None], -1).mean()


def _expected(model, params, batch, schedule):
  """angular_distance, logit_lens_kl and skip_delta_loss of the loop reference."""
  views, logits = _loop(model, params, batch['inputs'], schedule)
  last = [np.asarray(v[:, -1], np.float64) for v in views]
  cos = [np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
         for a, b in zip(last[:-1], last[1:])]
  final = _log_softmax64(logits)
  kl = []
  for v in views[1:]:
    lp = _log_softmax64(_apply(model, params, v, Transformer.unembed))
    kl.append(np.mean(np.sum(np.exp(lp) * (lp - final), -1)))
  base = _ce64(logits, batch)
  skip = [_ce64(_loop(model, params, batch['inputs'], schedule, s)[1], batch) - base
          for s in range(model.cfg.num_layers)]
  return {'angular_distance': [np.mean(np.arccos(np.clip(c, -1, 1)) / np.pi) for c in cos],
          'logit_lens_kl': kl, 'skip_delta_loss': skip}


def _batch(cfg):
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, cfg.data.seq_len + 1), 0,
                              cfg.model.vocab_size)
  return {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
          'weights': jnp.ones((2, cfg.data.seq_len), jnp.float32)}


def _check(layers, expected):
  for name, ref in expected.items():
    np.testing.assert_allclose(layers[name], ref, rtol=1e-3, atol=5e-5, err_msg=name)


@pytest.mark.parametrize('design', list(residual.DESIGNS))
def test_analyses_of_every_residual_design_match_the_loop_reference(design):
  """The analysed stream is the design's view of its carry; skipping a block keeps the
  whole carry (its streams, DWA history, AttnRes sources), as the loop reference does."""
  cfg = small_config(**{'model.residual': design, 'model.attn_res_blocks': 2})
  model, init, params = _perturbed(cfg, 5)
  batch = _batch(cfg)
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  layers, _ = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0)(params)
  _check(layers, _expected(model, params, batch, layer_schedule(cfg.model)))


@pytest.mark.parametrize('method', ['prores', 'branchnorm'])
def test_analyses_mid_schedule_use_the_steps_layer_inputs(method):
  """At step 7 of a ProRes warmup (alpha < 1) or before BranchNorm's T, the analysed model
  is the trained (and evaluated) one, not the static schedule's."""
  over = ({'train.prores': 'linear', 'train.prores_warmup_steps': 20} if method == 'prores'
          else {'model.block': 'branchnorm', 'train.branchnorm_steps': 20})
  cfg = small_config(**over)
  model, init, params = _perturbed(cfg, 6)
  batch = _batch(cfg)
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  layers, _ = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0, cfg)(params, 7)
  inputs = dynamics.layer_inputs(cfg, 7, jax.random.PRNGKey(0), 2, False)
  expected = _expected(model, params, batch, scan_inputs(cfg.model, inputs))
  _check(layers, expected)
  static = _expected(model, params, batch, layer_schedule(cfg.model))
  assert np.abs(np.subtract(static['skip_delta_loss'], expected['skip_delta_loss'])).max() > 1e-3


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


def test_gaussian_draws_before_the_scan_are_the_per_layer_draws():
  """The jvp's v of layer l, drawn for all layers at once outside the scan, is the draw that
  layer's own key gives (what jacobian_identity_dev measured when drawn inside the scan)."""
  tree = {'x': jnp.zeros((2, 3, 4)), 'gate': jnp.zeros((1,), jnp.bfloat16)}
  keys = jax.random.split(jax.random.PRNGKey(3), 5)
  drawn = jax.vmap(lambda k: analysis.gaussian_like(k, tree))(keys)
  for l, key in enumerate(keys):
    own = analysis.gaussian_like(key, tree)
    for leaf, one in zip(jax.tree.leaves(drawn), jax.tree.leaves(own)):
      assert leaf.dtype == one.dtype and np.array_equal(np.asarray(leaf[l]), np.asarray(one))


def test_eranks_by_shape_are_each_stacks_erank():
  rng = np.random.default_rng(0)
  mats = [jnp.asarray(rng.normal(size=s), jnp.float32)
          for s in ((2, 4, 6), (2, 6, 4), (2, 4, 6), (2, 3, 3))]
  both = jax.jit(lambda ms: (analysis.eranks_by_shape(ms), [analysis.erank(m) for m in ms]))
  for e, own in zip(*both(mats)):  # one program, as inside the analysis
    np.testing.assert_allclose(e, own, rtol=1e-6)


SAMPLED = ('skip_delta_loss', 'erank_acts', 'erank_weights')  # one pass or SVD per layer


def test_sampled_layers_give_the_full_analysis_numbers(analysed):
  """metrics.analysis_layers=2 of L=3: skip_delta_loss and the eranks of layers 1 and 3 equal
  the full analysis's, NaN on layer 2; every other metric is the full one on every layer;
  effective_depth/skip counts over the sampled layers, scaled to L."""
  cfg, model, init, params, batch, full, _ = analysed
  assert analysis.evenly_spaced(3, 2) == [0, 2]
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  layers, scalars = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0, None, [0, 2])(params)
  assert set(layers) == set(full)
  for k, v in layers.items():
    if k in SAMPLED:
      np.testing.assert_allclose(np.asarray(v)[[0, 2]], np.asarray(full[k])[[0, 2]], rtol=1e-5, atol=1e-6, err_msg=k)
      assert np.isnan(v[1]), k
    else:
      np.testing.assert_allclose(v, full[k], rtol=1e-5, atol=1e-6, err_msg=k)
  ratio = analysis.ed_skip(np.asarray(full['skip_delta_loss'])[[0, 2]]) / 2
  assert scalars['effective_depth/skip_ratio'] == ratio
  assert scalars['effective_depth/skip'] == 3 * ratio


def _scan_carries(jaxpr, length: int) -> set[tuple[int, ...]]:
  """Shapes of the carries of every scan of `length` steps in a jaxpr (sub-jaxprs included)."""
  shapes = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'scan' and eqn.params['length'] == length:
      first = eqn.params['num_consts']
      shapes |= {v.aval.shape for v in eqn.invars[first:first + eqn.params['num_carry']]}
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        sub = getattr(sub, 'jaxpr', sub)  # a ClosedJaxpr's Jaxpr
        if hasattr(sub, 'eqns'):
          shapes |= _scan_carries(sub, length)
  return shapes


@pytest.mark.parametrize('analysis_layers', [32, 0])
def test_default_analysis_of_1024_layers_runs_a_bounded_number_of_passes(analysis_layers):
  """At L=1024 (traced, not run) the default analysis runs the 1024 blocks once on the
  stream (the probe) and once on 32 skipped-block streams batched (32 forward passes, first
  and last layer among them); metrics.analysis_layers=0 on 1024 streams."""
  cfg = small_config(**{'model.num_layers': 1024, 'metrics.analysis_layers': analysis_layers})
  sampled = analysis.analysed_layers(cfg)
  expected = 32 if analysis_layers else 1024
  assert len(sampled) == expected and sampled[0] == 0 and sampled[-1] == 1023
  model = make_model(cfg)
  params = jax.eval_shape(lambda: init_state(model, make_optimizer(cfg), 0, cfg.data.seq_len))['params']
  batch = jax.eval_shape(lambda: _batch(cfg))
  jaxpr = jax.make_jaxpr(analysis.make_analysis_fn(model, cfg, sampled))(
      params, batch, jax.random.PRNGKey(0), 0)
  stream = (2, cfg.data.seq_len, cfg.model.d_model)  # the analysis rows' residual stream
  assert _scan_carries(jaxpr.jaxpr, 1024) == {stream, (expected,) + stream}


def test_tensorboard_shows_a_sampled_metric_at_its_true_layers(tmp_path):
  """L=1024: a metric on every layer at the 64 TensorBoard layers, one sampled on 32 layers
  (NaN elsewhere) at those 32."""
  logs = loop._Logs(str(tmp_path), 0, analysis.evenly_spaced(1024, 64))
  sampled = np.full(1024, np.nan)
  sampled[analysis.evenly_spaced(1024, 32)] = 1.0
  assert logs.tb_layers_of(np.ones(1024)) == analysis.evenly_spaced(1024, 64)
  assert logs.tb_layers_of(sampled) == analysis.evenly_spaced(1024, 32)
  logs.close()


@pytest.mark.parametrize('bad', [-1, 1])
def test_analysis_layers_out_of_range_is_a_one_line_config_error(bad):
  with pytest.raises(ConfigError, match=rf'^metrics.analysis_layers={bad} is invalid: allowed 0 '
                     r'\(every layer\) or an integer >= 2$'):
    validate(tiny_config(**{'metrics.analysis_layers': bad}))


@pytest.mark.parametrize('mode', ['light', 'fast'])
def test_light_and_fast_compiled_analyses_give_the_optimized_numbers(analysed, mode):
  """metrics.analysis_compile='light' or 'fast' (CPU: LLVM level 1 or 0, XLA's loop emitters)
  compiles the same function: every metric equals the default program's (which the tests above
  check in float64)."""
  cfg, model, init, params, batch, layers, scalars = analysed
  level = ops.CPU_OPT_LEVELS[mode]
  reduced = ops.compiler_options('cpu', opt_level=level)
  assert reduced['xla_backend_optimization_level'] == level
  assert reduced['xla_cpu_use_fusion_emitters'] is False
  assert not {'xla_backend_optimization_level', 'xla_cpu_use_fusion_emitters'} & set(
      ops.compiler_options('cpu') or {})
  assert ops.compiler_options('tpu', opt_level=level) is None
  plan = sharding.make_plan(cfg, model, make_optimizer(cfg), init_state)
  other, other_scalars = analysis.Analyzer(model, plan, init['blocks'], batch, 2, 0,
                                           opt_level=level)(params)
  assert set(other) == set(layers)
  for k, v in other.items():
    np.testing.assert_allclose(v, layers[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert other_scalars == scalars


def test_auto_compile_is_fast_when_a_runs_analyses_total_few_flops_else_light():
  """'auto': fast iff (analyses in the run) x (one analysis's forward FLOPs) <=
  FAST_COMPILE_FLOPS, else light; the FLOPs counted by hand here: L=3 blocks of N/3
  parameters, 2 probe passes, K=3 skip passes, V=256."""
  cfg = tiny_config(**{'train.steps': 10, 'metrics.analysis_every': 4})  # steps 0, 4, 8, 9
  m, t, rows = cfg.model, cfg.data.seq_len, cfg.metrics.analysis_batch_size
  n = 1000
  by_hand = rows * t * ((2 + 3) * (2 * n + 4 * t * m.d_model * 3) + (3 + 1 + 3) * 2 * m.d_model * 256)
  assert m.num_layers == 3 and m.vocab_size == 256
  assert analysis.analysis_flops(cfg, n) == by_hand
  assert analysis.compile_mode(cfg, n) == 'fast'
  at_bound = int(analysis.FAST_COMPILE_FLOPS / (4 * rows * t * 10))  # 4 runs just above it
  assert analysis.compile_mode(cfg, at_bound) == 'light'
  assert analysis.compile_mode(cfg, at_bound // 2) == 'fast'
  for mode in ('optimized', 'light', 'fast'):
    cfg.metrics.analysis_compile = mode
    assert analysis.compile_mode(cfg, n) == mode
    assert analysis.compile_mode(cfg, 10**12) == mode


def test_analysis_compile_out_of_range_is_a_one_line_config_error():
  with pytest.raises(ConfigError, match=r'^metrics.analysis_compile=.?slow.? is invalid: allowed '
                     r'one of auto, fast, light, optimized$'):
    validate(tiny_config(**{'metrics.analysis_compile': 'slow'}))
