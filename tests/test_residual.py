"""Residual-stream designs: the defining property of each (spec residual_params_dynamics.md)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale import config
from depthscale.model import residual
from depthscale.model.norms import LayerNorm
from depthscale.model.placements import layer_schedule
from depthscale.model.transformer import Attention, Block, Mlp, make_model
from depthscale.training.optim import decay_mask, make_optimizer
from depthscale.training.steps import init_state
from tests.helpers import covers, init, layer_params, perturb, tiny_config, validates_unless


def _params(cfg):
  model, tx = make_model(cfg), make_optimizer(cfg)
  return jax.jit(lambda: init_state(model, tx, 0, cfg.data.seq_len)['params'])()


@functools.partial(jax.jit, static_argnums=0)
def _apply(model, params, tokens):
  """model.apply jitted: one program per model (a base model's serves several tests)."""
  return model.apply({'params': params}, tokens)


def _logits(cfg, params, tokens, collect_stats=False):
  return _apply(make_model(cfg, collect_stats), params, tokens)


def _tokens(cfg):
  return jax.random.randint(jax.random.PRNGKey(1), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)


def _standard_part(params):
  """The parameters a standard model has: drop every residual-design entry."""
  if isinstance(params, dict):
    return {k: _standard_part(v) for k, v in params.items()
            if not k.startswith('res_') and k != 'value_gate'}
  return params


@functools.partial(jax.jit, static_argnums=0)
def _final_carry(model, params, tokens):
  def run(m, t):
    return m.blocks(m.start(m.embed(t)), layer_schedule(m.cfg))[0]
  return model.apply({'params': params}, tokens, method=run)


def _connect(conn, params, carry, k):
  """A connection's read h and the carry its write leaves with the branch F(h) = tanh(h),
  as one program."""
  @jax.jit
  def run(params, carry):
    h, write = conn.apply({'params': params}, carry, jnp.int32(k))
    return h, write(jnp.tanh(h))
  return run(params, carry)


def _rand(seed, shape):
  return np.asarray(jax.random.normal(jax.random.PRNGKey(seed), shape), np.float64)


@pytest.mark.parametrize('dynamic', [True, False])
def test_hyper_connections_at_init_equal_pre_ln_exactly(dynamic):
  """Every one of the n streams equals the Pre-LN residual stream bitwise after block L."""
  cfg = tiny_config(**{'model.residual': 'hyper_connections', 'model.hc_dynamic': dynamic})
  base = tiny_config()
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  streams = _final_carry(model, params, tokens)['x']
  ref = _final_carry(make_model(base), _standard_part(params), tokens)['x']
  assert streams.shape[0] == cfg.model.hc_rate
  for s in streams:
    np.testing.assert_array_equal(s, ref)
  logits, stats = _logits(cfg, params, tokens, collect_stats=True)
  ref_logits, ref_stats = _logits(base, _standard_part(params), tokens, collect_stats=True)
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
  for name in ('act_rms', 'update_ratio'):  # the recorded stream is the mean of the n streams
    np.testing.assert_allclose(stats[name], ref_stats[name], rtol=1e-5)


def test_hyper_connection_static_equations():
  """With random A_m, A_r, B: h_in = A_m^T H and H_out = B F(h_in) + A_r^T H (float64 ref)."""
  cfg = tiny_config(**{'model.residual': 'hyper_connections', 'model.hc_dynamic': False}).model
  n, k = cfg.hc_rate, 5
  h = _rand(0, (n, 2, 3, 8))
  p = {'a_m': _rand(1, (n,)), 'a_r': _rand(2, (n, n)), 'b': _rand(3, (n,))}
  conn = residual.HyperConnection(cfg)
  h_in, out = _connect(conn, p, {'x': jnp.asarray(h, jnp.float32)}, k)
  a_m = np.eye(n)[k % n] + p['a_m']
  a_r, b = np.eye(n) + p['a_r'], 1 + p['b']
  ref_in = np.einsum('n,nbtd->btd', a_m, h)
  np.testing.assert_allclose(h_in, ref_in, rtol=1e-5, atol=1e-5)
  out = out['x']
  f = np.tanh(ref_in) - ref_in
  ref_out = b[:, None, None, None] * f + np.einsum('ij,ibtd->jbtd', a_r, h)
  np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('scale,bias', [(0.5, 0.0), (0.1, residual.MHC_RES_DIAG)])
def test_mhc_sinkhorn_is_doubly_stochastic(scale, bias):
  """Random logits, and the init's 2 I plus a perturbation; with 20 iterations rows reach
  1e-5 only for moderate logit ranges (peaked logits converge slowly: see README)."""
  logits = scale * _rand(4, (64, 4, 4)) + bias * np.eye(4)
  m = np.asarray(residual.sinkhorn(jnp.asarray(logits), 20), np.float64)
  assert np.all(m > 0)
  np.testing.assert_allclose(m.sum(-1), 1, atol=1e-5)
  np.testing.assert_allclose(m.sum(-2), 1, atol=1e-5)


def test_mhc_at_init_is_pre_ln_up_to_eps():
  """Documented init: sum(H_pre) = 1, H_post = 1, H_res doubly stochastic, so identical
  streams stay identical and the model is Pre-LN up to the Sinkhorn/gate epsilons."""
  cfg = tiny_config(**{'model.residual': 'mhc'})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  logits, _ = _logits(cfg, params, tokens)
  ref, _ = _logits(tiny_config(), _standard_part(params), tokens)
  np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


def test_denseformer_at_init_equals_standard_exactly():
  over = {'model.num_layers': 4, 'model.dwa_dilation': 2, 'model.dwa_period': 2}
  cfg = tiny_config(**{'model.residual': 'denseformer', **over})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  logits, _ = _logits(cfg, params, tokens)
  ref, _ = _logits(tiny_config(**over), _standard_part(params), tokens)
  np.testing.assert_array_equal(logits, ref)


@covers('residual.DESIGNS', 'denseformer')
@pytest.mark.parametrize('index', [1, 2, 3, 4])
def test_dwa_averages_block_outputs_of_its_dilation_group(index):
  """Y_i = sum_{j <= i, j = i mod k} alpha_ij X_j when p | i, else X_i (float64 ref)."""
  cfg = tiny_config(**{'model.residual': 'denseformer', 'model.num_layers': 4,
                       'model.dwa_dilation': 2, 'model.dwa_period': 2}).model
  hist = _rand(5, (5, 2, 3, 8))
  x = _rand(6, (2, 3, 8))
  alpha = _rand(7, (5,))
  carry = {'x': jnp.asarray(x, jnp.float32), 'dwa': jnp.asarray(hist, jnp.float32)}
  out = residual.DepthWeightedAverage(cfg).apply({'params': {'alpha': alpha}}, carry,
                                                 jnp.int32(index))
  hist[index] = x
  weights = alpha + np.eye(5)[index]
  group = [j for j in range(index + 1) if (index - j) % 2 == 0]
  ref = sum(weights[j] * hist[j] for j in group) if index % 2 == 0 else x
  np.testing.assert_allclose(out['x'], ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['dwa'], hist, rtol=0, atol=0)


def _attn_res_sources_for(k: int, sizes: list[int]) -> tuple[list[int], bool]:
  """Spec reference: the block n (1-based) holding sublayer k and whether its partial sum
  is a source (i >= 2 in the spec's 1-based position)."""
  start = 0
  for n, size in enumerate(sizes, 1):
    if k < start + size:
      return list(range(n)), k > start
    start += size
  raise ValueError(k)


@covers('residual.DESIGNS', 'block_attn_res', 'attn_res')
@pytest.mark.parametrize('blocks', [1, 2, 4, 6])
def test_attn_res_zero_query_averages_sources_uniformly(blocks):
  """Block AttnRes with w = 0 reads the uniform mean of its sources; L_sub = 6 sublayers,
  S = L_sub // N per block, the last block takes the remainder (N = 6 is full AttnRes)."""
  cfg = tiny_config(**{'model.residual': 'block_attn_res', 'model.attn_res_blocks': blocks}).model
  subs = 2 * cfg.num_layers
  size = subs // blocks
  sizes = [size] * (blocks - 1) + [subs - size * (blocks - 1)]
  sources = _rand(8, (blocks + 1, 2, 3, 8))
  conn = residual.AttnResConnection(cfg)
  carry = {'x': jnp.zeros((2, 3, 8)), 'sources': jnp.asarray(sources, jnp.float32)}
  params = jax.jit(conn.init)(jax.random.PRNGKey(0), carry, jnp.int32(0))['params']
  assert not np.any(params['read']['query'])

  @jax.jit
  def read_and_write(k, v):  # one program for every k
    h, write = conn.apply({'params': params}, carry, k)
    return h, write(h + v)['sources']

  v = _rand(9, (2, 3, 8))
  for k in range(subs):
    h, after = read_and_write(jnp.int32(k), v)
    done, partial = _attn_res_sources_for(k, sizes)
    used = done + ([len(done)] if partial else [])
    np.testing.assert_allclose(h, sources[used].mean(0), rtol=1e-5, atol=1e-5)
    expect = sources.copy()
    expect[len(done)] += v
    np.testing.assert_allclose(after, expect, rtol=1e-5, atol=1e-5)


@covers('residual.DESIGNS', 'attn_res')
def test_attn_res_weights_are_softmax_of_query_dot_rmsnormed_keys():
  cfg = tiny_config(**{'model.residual': 'attn_res'}).model
  sources = _rand(10, (4, 2, 3, 8))
  w = _rand(11, (8,))
  valid = np.array([True, True, False, True])
  read = residual.DepthSoftmax(cfg)
  h = read.apply({'params': {'query': w, 'key_norm': {'scale': np.ones(8)}}},
                 jnp.asarray(sources, jnp.float32), jnp.asarray(valid))
  keys = sources / np.sqrt(np.mean(sources ** 2, -1, keepdims=True) + cfg.norm_eps)
  logits = np.einsum('sbtd,d->sbt', keys, w)[valid]
  p = np.exp(logits - logits.max(0)) / np.exp(logits - logits.max(0)).sum(0)
  np.testing.assert_allclose(h, np.einsum('sbt,sbtd->btd', p, sources[valid]), rtol=1e-4, atol=1e-5)


@covers('residual.DESIGNS', 'laurel')
@covers('residual.LAURELS', *residual.LAURELS)
@pytest.mark.parametrize('variant', ['rw', 'lr', 'pa', 'rw_lr'])
def test_laurel_equations(variant):
  """rw: alpha F + beta x with (alpha, beta) = 2 softmax; lr: F + x + B A x; rw_lr:
  alpha F + beta (x + B A x); pa: F + x + sum_j gamma_j x_{i-j} (float64 ref)."""
  cfg = tiny_config(**{'model.residual': 'laurel', 'model.laurel': variant}).model
  x, prev = _rand(12, (2, 3, 8)), _rand(13, (cfg.laurel_window, 2, 3, 8))
  carry = {'x': jnp.asarray(x, jnp.float32), 'prev': jnp.asarray(prev, jnp.float32)}
  conn = residual.Laurel(cfg)
  params = dict(jax.jit(conn.init)(jax.random.PRNGKey(0), carry, jnp.int32(0))['params'])
  h0, out0 = _connect(conn, params, carry, 0)
  np.testing.assert_array_equal(out0['x'], jnp.tanh(h0))  # standard at init
  params = {k: _rand(14 + i, v.shape) for i, (k, v) in enumerate(sorted(params.items()))}
  out = _connect(conn, params, carry, 0)[1]
  f = np.tanh(x) - x
  alpha, beta = 1.0, 1.0
  if 'rw' in variant:
    e = np.exp(params['rw_logits'])
    alpha, beta = 2 * e / e.sum()
  skip = x
  if 'lr' in variant:
    skip = x + np.einsum('btr,dr->btd', np.einsum('btd,rd->btr', x, params['a']), params['b'])
  if variant == 'pa':
    skip = x + np.einsum('k,kbtd->btd', params['gamma'], prev)
    np.testing.assert_array_equal(out['prev'], np.concatenate([x[None], prev[:-1]]).astype(np.float32))
  np.testing.assert_allclose(out['x'], alpha * f + beta * skip, rtol=1e-4, atol=1e-4)


@covers('residual.VALUE_RESIDUALS', 'resformer', 'svformer', 'satformer')
def test_value_residual_formulas():
  v, v1, gate = _rand(20, (2, 3, 2, 4)), _rand(21, (2, 3, 2, 4)), _rand(22, (2, 3, 2))
  expected = {'resformer': 0.5 * v1 + 0.5 * v, 'svformer': v1,
              'satformer': v + np.maximum(gate, 0)[..., None] * v1}
  for kind, ref in expected.items():
    for first in (True, False):
      out = residual.mix_values(kind, jnp.asarray(v), jnp.asarray(v1), jnp.asarray(first),
                                jnp.asarray(gate))
      np.testing.assert_allclose(out, v if first else ref, rtol=1e-6, atol=1e-6)


def test_svformer_ignores_value_projections_after_layer_1():
  cfg = tiny_config(**{'model.value_residual': 'svformer'})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)

  def loss(p):
    return model.apply({'params': p}, tokens)[0].sum()

  g_kv = jax.jit(jax.grad(loss))(params)['blocks']['attn']['kv']  # L x D x 2 x K x E; [:, :, 1] = W_V
  assert np.all(np.asarray(g_kv[1:, :, 1]) == 0)
  assert np.any(np.asarray(g_kv[0, :, 1]) != 0) and np.any(np.asarray(g_kv[1:, :, 0]) != 0)


def test_satformer_with_zero_gate_weights_is_standard():
  sat = tiny_config(**{'model.value_residual': 'satformer'})
  params, tokens = _params(sat), _tokens(sat)
  assert params['blocks']['value_gate'].shape == (sat.model.num_layers, 32, 2)
  params['blocks']['value_gate'] = jnp.zeros_like(params['blocks']['value_gate'])
  logits, _ = _logits(sat, params, tokens)
  ref, _ = _logits(tiny_config(), _standard_part(params), tokens)
  np.testing.assert_array_equal(logits, ref)


@covers('residual.PARALLEL_BLOCKS', 'gptj', 'neox')
@pytest.mark.parametrize('form', ['gptj', 'neox'])
def test_parallel_block_equations(form):
  """gptj: x + Attn(N(x)) + MLP(N(x)); neox: x + Attn(N1(x)) + MLP(N2(x))."""
  cfg = tiny_config(**{'model.parallel_block': form})
  params = jax.tree.map(lambda p: p[0], _params(cfg)['blocks'])
  assert ('mlp_norm' in params) == (form == 'neox')
  x = jnp.asarray(_rand(23, (2, cfg.data.seq_len, 32)), jnp.float32)
  model_cfg = make_model(cfg).cfg  # attention kernel and unrolling resolved for the devices
  out, _ = jax.jit(Block(model_cfg).apply)({'params': params}, {'x': x}, {'index': jnp.int32(1)})

  @jax.jit
  def reference(params, x):
    norm = lambda name: LayerNorm(eps=cfg.model.norm_eps).apply({'params': params[name]}, x)
    a = Attention(model_cfg).apply({'params': params['attn']}, norm('attn_norm'))
    m = Mlp(model_cfg).apply({'params': params['mlp']},
                             norm('mlp_norm' if form == 'neox' else 'attn_norm'))
    return x + a + m

  np.testing.assert_allclose(out['x'], reference(params, x), rtol=1e-5, atol=1e-5)


def test_residual_weights_are_not_decayed_by_default():
  cfg = tiny_config(**{'model.residual': 'denseformer'})
  params = _params(cfg)
  mask = decay_mask(cfg, params)
  assert not mask['blocks']['res_dwa']['alpha'] and mask['blocks']['attn']['q']
  cfg.optim.decay_residual = True
  assert decay_mask(cfg, params)['blocks']['res_dwa']['alpha']


@pytest.mark.parametrize('field,value', [('model.residual', 'highway'),
                                         ('model.dwa_period', 2),
                                         ('model.value_residual', 'v1'),
                                         ('model.parallel_block', 'palm'),
                                         ('model.hc_rate', 0)])
def test_bad_residual_config_names_the_field(field, value):
  cfg = tiny_config(**{field: value})  # num_layers = 3: period 2 does not divide it
  with pytest.raises(config.ConfigError, match=field):
    config.validate(cfg)


def test_parallel_block_needs_pre_ln():
  post = tiny_config(**{'model.parallel_block': 'gptj', 'model.block': 'post_ln'})
  with pytest.raises(config.ConfigError, match='model.parallel_block'):
    config.validate(post)


def _randomized(conn, carry, k, seed):
  """Every parameter of a connection drawn from N(0, 1) (float64 copies for the reference)."""
  shapes = jax.eval_shape(conn.init, jax.random.PRNGKey(0), carry, jnp.int32(k))['params']
  leaves, tree = jax.tree.flatten(nn.unbox(shapes))
  return tree.unflatten([_rand(seed + i, a.shape) for i, a in enumerate(leaves)])


def _layernorm64(x, p, eps):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


@covers('residual.DESIGNS', 'hyper_connections')
def test_dynamic_hyper_connection_with_random_weights_matches_float64():
  """Dynamic HC (Zhu et al. eqs. 10-13) away from init: T = tanh(LN(H) W) per stream,
  A_m = e_k + a_m + s_a T_m, A_r[i, j] = I + a_r + s_a T_r[i, j], B = 1 + b + s_b T_b;
  h_in = sum_i A_m[i] H_i, H'_j = B_j F(h_in) + sum_i A_r[i, j] H_i (float64 ref)."""
  cfg = tiny_config(**{'model.residual': 'hyper_connections', 'model.hc_dynamic': True}).model
  n, k = cfg.hc_rate, 6
  h = _rand(30, (n, 2, 3, 8))
  carry = {'x': jnp.asarray(h, jnp.float32)}
  conn = residual.HyperConnection(cfg)
  p = _randomized(conn, carry, k, 31)
  h_in, out = _connect(conn, p, carry, k)
  t = np.tanh(np.einsum('nbtd,de->nbte', _layernorm64(h, p['norm'], cfg.norm_eps), p['w']))
  s_a, s_b = residual.HC_SCALE_INIT + p['s_alpha'], residual.HC_SCALE_INIT + p['s_beta']
  a_m = (np.eye(n)[k % n] + p['a_m'])[:, None, None] + s_a * t[..., 0]  # n x B x T
  a_r = (np.eye(n) + p['a_r'])[:, :, None, None] + s_a * np.moveaxis(t[..., 1:n + 1], -1, 1)
  b = (1 + p['b'])[:, None, None] + s_b * t[..., n + 1]
  ref_in = np.einsum('nbt,nbtd->btd', a_m, h)
  np.testing.assert_allclose(h_in, ref_in, rtol=1e-4, atol=1e-4)
  out = out['x']
  f = np.tanh(ref_in) - ref_in
  ref_out = b[..., None] * f + np.einsum('ijbt,ibtd->jbtd', a_r, h)
  np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-4)


def _sinkhorn64(logits, iters, eps=residual.SINKHORN_EPS):
  m = np.exp(logits - logits.max(-1, keepdims=True))
  m = m / m.sum(-1, keepdims=True) + eps
  m = m / (m.sum(-2, keepdims=True) + eps)
  for _ in range(iters - 1):
    m = m / (m.sum(-1, keepdims=True) + eps)
    m = m / (m.sum(-2, keepdims=True) + eps)
  return m


def _flat_mix64(x, phi, eps):
  n, b, t, d = x.shape
  flat = np.moveaxis(x, 0, 2).reshape(b, t, n * d)  # vec(X): stream-major per token
  return flat @ phi / np.sqrt(np.mean(flat ** 2, -1, keepdims=True) + eps)


def _sigmoid(z):
  return 1 / (1 + np.exp(-z))


@covers('residual.DESIGNS', 'mhc')
def test_mhc_connection_with_random_weights_matches_float64():
  """mHC away from its symmetric init: H_pre = sigma(a_pre mix + b_pre) + eps, H_post =
  2 sigma(a_post mix + b_post), H_res = Sinkhorn(a_res mat(mix) + b_res) (not symmetric);
  u = sum_i H_pre[i] X_i, X'_j = H_post[j] F(u) + sum_i H_res[i, j] X_i (float64 ref)."""
  cfg = tiny_config(**{'model.residual': 'mhc'}).model
  n = cfg.hc_rate
  x = _rand(40, (n, 2, 3, 8))
  carry = {'x': jnp.asarray(x, jnp.float32)}
  conn = residual.ManifoldHyperConnection(cfg)
  p = _randomized(conn, carry, 0, 41)
  p['phi'] = 0.1 * p['phi']  # moderate logits: Sinkhorn converges within its 20 iterations
  u, out = _connect(conn, p, carry, 0)
  mix = _flat_mix64(x, p['phi'], cfg.norm_eps)
  gate = residual.MHC_GATE_INIT + p['gate']
  pre = _sigmoid(gate[0] * mix[..., :n] + np.log(1 / (n - 1)) + p['b_pre']) + residual.SINKHORN_EPS
  post = 2 * _sigmoid(gate[1] * mix[..., n:2 * n] + p['b_post'])
  logits = gate[2] * mix[..., 2 * n:].reshape(2, 3, n, n) + residual.MHC_RES_DIAG * np.eye(n)
  h_res = _sinkhorn64(logits + p['b_res'], cfg.mhc_sinkhorn_iters)
  assert np.abs(h_res - np.swapaxes(h_res, -1, -2)).max() > 1e-2  # a transpose would show
  ref_u = np.einsum('btn,nbtd->btd', pre, x)
  np.testing.assert_allclose(u, ref_u, rtol=1e-4, atol=1e-5)
  out = out['x']
  ref = (np.moveaxis(post, -1, 0)[..., None] * (np.tanh(ref_u) - ref_u)
         + np.einsum('btij,ibtd->jbtd', h_res, x))
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@covers('residual.DESIGNS', 'mhc', 'hyper_connections')
def test_hc_and_mhc_readouts_with_random_weights_match_float64():
  """HC reads out the mean stream; mHC sum_i sigma(a_h mix + b_h)_i X_i + eps X_i."""
  cfg = tiny_config(**{'model.residual': 'mhc'}).model
  x = _rand(50, (cfg.hc_rate, 2, 3, 8))
  carry = {'x': jnp.asarray(x, jnp.float32)}
  np.testing.assert_allclose(residual.MeanStreams(cfg).apply({}, carry), x.mean(0), rtol=1e-5,
                             atol=1e-6)
  readout = residual.ManifoldReadout(cfg)
  params = nn.unbox(readout.init(jax.random.PRNGKey(0), carry)['params'])
  p = {k: _rand(52 + i, v.shape) for i, (k, v) in enumerate(sorted(params.items()))}
  n = cfg.hc_rate
  mix = _flat_mix64(x, p['phi'], cfg.norm_eps)
  w = _sigmoid((residual.MHC_GATE_INIT + p['gate']) * mix + np.log(1 / (n - 1)) + p['b'])
  ref = np.einsum('btn,nbtd->btd', w + residual.SINKHORN_EPS, x)
  np.testing.assert_allclose(readout.apply({'params': p}, carry), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('design', ['hyper_connections', 'attn_res'])
def test_block_hands_each_connection_its_residual_sublayer_index(design):
  """Block 2 of 2 (1-based) calls its attention and MLP connections with k = 2 and 3, the
  0-based residual-sublayer index: a Python reference that passes k by hand and applies
  Pre-LN's h + F(LN(h)), on distinct streams (sources) and parameters off init."""
  model, params = init(**{'model.residual': design})
  cfg, l = model.cfg, 1
  p = jax.jit(lambda params: layer_params(perturb(params, seed=4), l))(params)
  x = jnp.asarray(_rand(60, (2, 16, 16)), jnp.float32)
  carry = {'x': jnp.asarray(_rand(61, (cfg.hc_rate, 2, 16, 16)), jnp.float32)}
  if design == 'attn_res':
    carry = {'x': x, 'sources': jnp.asarray(_rand(62, (5, 2, 16, 16)), jnp.float32)}
  layer = jax.tree.map(lambda s: s[l], layer_schedule(cfg))
  out, _ = jax.jit(Block(cfg).apply)({'params': p}, carry, layer)

  @jax.jit
  def reference(p, ref):
    for j, (name, module) in enumerate((('attn', Attention), ('mlp', Mlp))):
      h, write = residual.DESIGNS[design].connection(cfg).apply({'params': p[f'res_{name}']}, ref,
                                                                jnp.int32(2 * l + j))
      normed = LayerNorm(eps=cfg.norm_eps).apply({'params': p[f'{name}_norm']}, h)
      ref = write(h + module(cfg).apply({'params': p[name]}, normed))
    return ref

  ref = reference(p, carry)
  for key in carry:
    np.testing.assert_allclose(out[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)


@pytest.mark.parametrize('design', sorted(residual.DESIGNS))
def test_a_plain_row_is_the_stream_x_plus_f_and_what_needs_one_reads_it(design):
  """`plain` holds exactly for the rows with nothing of their own (plain connection, no
  carry entries, readout, block end or history); DeepScaleLM's init and norm removal
  validate with those designs and fail in one line naming the field with the others."""
  row = residual.DESIGNS[design]
  x = jnp.ones((2, 4, 8))
  own = (row.connection is not residual.Plain or set(row.init(tiny_config().model, x)) != {'x'}
         or row.readout or row.block_end or row.history)
  assert row.plain == (not own)
  over = {'model.residual': design, 'model.attn_res_blocks': 2}
  dslm = tiny_config(**over, **{'model.init': 'deepscalelm'})
  no_norms = tiny_config(**over, **{'posthoc.init_from': 'L4', 'posthoc.remove_norms_every': 1})
  for cfg, field in ((dslm, 'model.init'), (no_norms, 'posthoc.remove_norms_every')):
    validates_unless(not row.plain, cfg,
                     rf'^{field}=.* is invalid: allowed .*model.residual in standard\)$')
