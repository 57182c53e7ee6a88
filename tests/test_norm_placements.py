"""Each placement's defining property (the equations are in docs/methods.md).

Post-LN and Pre-LN are checked in tests/test_model.py.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model.norms import RMSNorm
from depthscale.model.placements import Sublayer, deepnorm, keel, layer_schedule, num_post_blocks, pre_ln
from depthscale.model.transformer import Attention, Transformer, make_model
from tests.helpers import block_outputs, init, run_block, small_config, token_rms, tokens

D = 16
EPS = 1e-12  # norm epsilon of the tests that check a norm's output statistics at init


def _x(seed=0, scale=1.0):
  return scale * jax.random.normal(jax.random.PRNGKey(seed), (2, 16, D))


def _rms(x, eps=1e-5):
  return x / jnp.sqrt(jnp.mean(jnp.square(x), -1, keepdims=True) + eps)


def _layer(cfg, l):
  return jax.tree.map(lambda s: s[l], layer_schedule(cfg))


@functools.partial(jax.jit, static_argnums=(0, 3))
def _apply(model, params, x, method=None):
  """model.apply jitted: one program per model, method and shape."""
  return model.apply({'params': params}, x, method=method)


# The helpers' block references jitted whole: one program per model (and block).
_run_block = jax.jit(run_block, static_argnums=(0, 3))
_block_outputs = jax.jit(block_outputs, static_argnums=0)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _captured(model, params, x, l):
  """The module outputs run_block(capture=True) captures; a connection's write function,
  not an array, is left out."""
  inter = run_block(model, params, x, l, capture=True)[1]
  return jax.tree.map(lambda a: a if isinstance(a, jax.Array) else None, inter)


def _zero_branch_outputs(params):
  """W_O = W_down = 0: every branch returns 0."""
  blocks = params['blocks']
  blocks['attn']['o'] = jnp.zeros_like(blocks['attn']['o'])
  blocks['mlp']['wo'] = jnp.zeros_like(blocks['mlp']['wo'])
  return params


def test_lns_attention_input_is_rmsnorm_over_sqrt_l():
  cfg = small_config(**{'model.block': 'pre_ln', 'model.ln_scaling': True, 'model.norm': 'rmsnorm',
                        'model.num_layers': 4}).model
  x, seen = _x(), []
  for l in range(4):
    s = Sublayer('attn', lambda u: seen.append(u) or jnp.zeros_like(u), lambda role: _rms,
                 _layer(cfg, l), cfg)
    pre_ln(x, s)
    np.testing.assert_allclose(seen[-1], _rms(x) / math.sqrt(l + 1), rtol=1e-6)
  assert float(layer_schedule(small_config(**{'model.num_layers': 1,
                                              'model.ln_scaling': True}).model)['ln_scale'][0]) == 1


def test_lns_with_one_block_is_pre_ln():
  model, params = init(**{'model.block': 'pre_ln', 'model.ln_scaling': True, 'model.num_layers': 1})
  base = make_model(small_config(**{'model.block': 'pre_ln', 'model.num_layers': 1}))
  toks = tokens(small_config())
  np.testing.assert_array_equal(_apply(model, params, toks)[0], _apply(base, params, toks)[0])


def test_lns_stream_variance_below_pre_ln_and_gap_widens_with_depth():
  gaps = []
  for depth in (2, 6):
    model, params = init(**{'model.block': 'pre_ln', 'model.norm': 'rmsnorm',
                            'model.num_layers': depth})
    lns = make_model(small_config(**{'model.block': 'pre_ln', 'model.norm': 'rmsnorm',
                                     'model.num_layers': depth, 'model.ln_scaling': True}))
    x = _apply(model, params, tokens(small_config()), Transformer.embed)
    var = [float(jnp.var(_apply(m, params, x, Transformer.stack)[0])) for m in (model, lns)]
    assert var[1] < var[0]
    gaps.append(var[0] - var[1])
  assert gaps[1] > gaps[0]


def test_mix_ln_post_blocks():
  assert num_post_blocks(small_config(**{'model.block': 'mix_ln',
                                         'model.num_layers': 12}).model) == 3
  flags = np.asarray(layer_schedule(small_config(**{'model.block': 'mix_ln',
                                                    'model.num_layers': 12}).model)['post'])
  np.testing.assert_array_equal(flags, [True] * 3 + [False] * 9)
  model, params = init(**{'model.block': 'mix_ln', 'model.norm': 'rmsnorm', 'model.num_layers': 4,
                          'model.mix_ln_alpha': 0.5, 'model.norm_eps': EPS})
  x_in = _apply(model, params, tokens(small_config()), Transformer.embed)
  _, outs = _block_outputs(model, params, tokens(small_config()))
  for out in outs[:2]:  # blocks 0..P-1 end in the norm: per-token RMS = gain = 1
    np.testing.assert_allclose(token_rms(out), 1.0, atol=1e-4)
  _, outs = _block_outputs(model, _zero_branch_outputs(params), tokens(small_config()))
  np.testing.assert_allclose(outs[3], outs[1], atol=1e-7)  # Pre-LN blocks are the identity
  assert not np.allclose(outs[0], x_in, atol=1e-3)


def test_peri_ln_update_has_output_norm_rms_whatever_weight_scale():
  model, params = init(**{'model.block': 'peri_ln', 'model.norm': 'rmsnorm', 'model.norm_eps': EPS})
  params['blocks']['mlp']['wo'] = jnp.zeros_like(params['blocks']['mlp']['wo'])
  x = _x(1, 0.3)
  delta = _run_block(model, params, x, 0) - x  # the attention update alone
  np.testing.assert_allclose(token_rms(delta), 1.0, atol=1e-4)
  params['blocks']['attn_norm_out']['scale'] = 2.0 * params['blocks']['attn_norm_out']['scale']
  ref = _run_block(model, params, x, 0)
  np.testing.assert_allclose(token_rms(ref - x), 2.0, atol=1e-3)
  params['blocks']['attn']['o'] = 10.0 * params['blocks']['attn']['o']
  np.testing.assert_allclose(_run_block(model, params, x, 0), ref, atol=1e-4)


@pytest.mark.parametrize('on', [False, True])
def test_peri_ln_embedding_norm_flag(on):
  model, params = init('embed', **{'model.block': 'peri_ln', 'model.peri_embed_norm': on,
                                   'model.norm_eps': EPS})
  x = _apply(model, params, tokens(small_config()), Transformer.embed)
  assert ('embed_norm' in params) == on
  var = np.var(np.asarray(x), axis=-1)
  if on:
    np.testing.assert_allclose(var, 1.0, atol=1e-3)
  else:
    np.testing.assert_allclose(x, params['embedding'][tokens(small_config())], atol=0)


def test_deepnorm_pre_norm_sum_is_alpha_x_plus_f():
  cfg = small_config(**{'model.block': 'deepnorm', 'model.num_layers': 12}).model
  alpha = float(layer_schedule(cfg)['skip_alpha'][0])
  assert alpha == pytest.approx(2.2134, abs=1e-4)
  w = jax.random.normal(jax.random.PRNGKey(5), (D, D)) / 4
  seen, x = [], _x()
  norm = lambda role: lambda v: seen.append(v) or v
  deepnorm(x, Sublayer('attn', lambda u: u @ w, norm, _layer(cfg, 3), cfg))
  np.testing.assert_allclose(seen[0], alpha * x + x @ w, rtol=1e-5)
  assert 'final_norm' not in init(**{'model.block': 'deepnorm'})[1]


@pytest.mark.parametrize('block', ['deepnorm', 'sub_ln'])
def test_init_gains(block):
  model, params = init(**{'model.block': block, 'model.d_model': 64, 'model.num_heads': 2})
  attn, mlp = params['blocks']['attn'], params['blocks']['mlp']
  std_q, std_k, std_v = (float(jnp.std(a)) for a in (attn['q'], attn['kv'][:, :, 0], attn['kv'][:, :, 1]))
  d, f, num_layers = 64, 256, 2
  if block == 'deepnorm':
    beta = (8 * num_layers) ** -0.25
    assert std_q == pytest.approx(math.sqrt(2 / (d + d)), rel=0.03)  # Xavier, gain 1
    assert std_k == pytest.approx(std_q, rel=0.03)
    assert std_v / std_q == pytest.approx(beta, rel=0.03)
    assert float(jnp.std(mlp['wi'])) == pytest.approx(beta * math.sqrt(2 / (d + f)), rel=0.03)
  else:
    gain = math.sqrt(math.log(2 * num_layers))
    assert std_q == pytest.approx(0.02, rel=0.03) and std_k == pytest.approx(0.02, rel=0.03)
    for w in (attn['kv'][:, :, 1], attn['o'], mlp['wi'], mlp['wo']):
      assert float(jnp.std(w)) / std_q == pytest.approx(gain, rel=0.03)


def test_sub_ln_inputs_of_w_o_and_w_2_are_normalized():
  model, params = init(**{'model.block': 'sub_ln', 'model.norm_eps': EPS})
  inter = _captured(model, params, _x(2), 0)
  for name in ('attn', 'mlp'):
    y = np.asarray(inter[name]['inner_norm']['__call__'][0], np.float64)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(-1), 1, atol=1e-3)
  assert inter['mlp']['inner_norm']['__call__'][0].shape[-1] == 64  # over d_ff


@functools.partial(jax.jit, static_argnums=0)
def _attention(model, params, x):
  attn_params = jax.tree.map(lambda p: p[0], params['blocks']['attn'])
  return Attention(model.cfg).apply({'params': attn_params}, x)


def test_normformer_head_scale_paper_form_gates_head_values():
  model, params = init(**{'model.block': 'normformer'})
  x = _x(3)
  params['blocks']['attn']['head_scale'] = jnp.array([[0.0, 1.0], [0.0, 1.0]])
  ref = _attention(model, params, x)
  kv = params['blocks']['attn']['kv']
  params['blocks']['attn']['kv'] = kv.at[:, :, 1, 0].multiply(-3.0)  # head 0's W_V
  np.testing.assert_allclose(_attention(model, params, x), ref, atol=1e-6)
  params['blocks']['attn']['kv'] = kv.at[:, :, 1, 1].multiply(-3.0)  # head 1's W_V
  assert not np.allclose(_attention(model, params, x), ref, atol=1e-4)


def test_normformer_head_scale_code_form_scales_output_chunks():
  model, params = init(**{'model.block': 'normformer', 'model.normformer_head_scale': 'code'})
  x = _x(3)
  params['blocks']['attn']['head_scale'] = jnp.array([[0.0, 1.0], [0.0, 1.0]])
  out = _attention(model, params, x)
  np.testing.assert_array_equal(out[..., :D // 2], 0)
  assert np.abs(np.asarray(out[..., D // 2:])).min() > 0


def test_normformer_attention_update_is_normalized_and_resid_scale_option():
  model, params = init(**{'model.block': 'normformer', 'model.norm_eps': EPS})
  params['blocks']['mlp']['wo'] = jnp.zeros_like(params['blocks']['mlp']['wo'])
  x = _x(4)
  delta = np.asarray(_run_block(model, params, x, 0) - x, np.float64)
  np.testing.assert_allclose(delta.mean(-1), 0, atol=1e-5)
  np.testing.assert_allclose(delta.var(-1), 1, atol=1e-3)
  assert 'mlp_resid_scale' not in params['blocks']
  _, params = init(**{'model.block': 'normformer', 'model.normformer_resid_scale': True})
  np.testing.assert_array_equal(params['blocks']['mlp_resid_scale'], 1.0)


@pytest.mark.parametrize('block', ['hybridnorm', 'hybridnorm_star'])
def test_hybridnorm(block):
  model, params = init(**{'model.block': block, 'model.norm': 'rmsnorm', 'model.norm_eps': EPS})
  x = _x(5, 0.05)
  inter = _captured(model, params, x, 1)
  for name in ('q_norm', 'k_norm', 'v_norm'):  # per-head RMS 1 before RoPE
    np.testing.assert_allclose(token_rms(inter['attn'][name]['__call__'][0]), 1.0, atol=1e-4)
  np.testing.assert_allclose(token_rms(inter['mlp_norm']['__call__'][0]), 1.0, atol=1e-4)
  zeroed = _zero_branch_outputs(params)
  out0, out1 = _run_block(model, zeroed, x, 0), _run_block(model, zeroed, x, 1)
  np.testing.assert_allclose(token_rms(out1), 1.0, atol=1e-4)  # the FFN skip is normalized
  if block == 'hybridnorm_star':
    np.testing.assert_array_equal(out0, x)  # block 1 is Pre-Norm: the identity here
  else:
    np.testing.assert_allclose(out0, out1, atol=1e-6)


def test_keel_scaled_skip_weights_the_branch_one_over_alpha():
  cfg = small_config(**{'model.block': 'keel', 'model.num_layers': 3}).model
  assert float(layer_schedule(cfg)['skip_alpha'][0]) == 6.0
  assert float(layer_schedule(small_config(**{'model.block': 'keel', 'model.keel_alpha': 'blocks',
                                              'model.num_layers': 3})
                              .model)['skip_alpha'][0]) == 3.0
  w = jax.random.normal(jax.random.PRNGKey(6), (D, D))
  x = _x(7)
  out = keel(x, Sublayer('attn', lambda u: u @ w, lambda role: _rms, _layer(cfg, 0), cfg))
  np.testing.assert_allclose(out, _rms(x + (_rms(x) @ w) / 6.0), rtol=1e-4, atol=1e-5)
  zero = keel(x, Sublayer('attn', jnp.zeros_like, lambda role: _rms, _layer(cfg, 0), cfg))
  np.testing.assert_allclose(zero, _rms(x), rtol=1e-4, atol=1e-6)  # eps aside


@pytest.mark.parametrize('block', ['mix_ln', 'post_ln'])
def test_gpas_at_init_is_bit_identical_to_base(block):
  model, params = init(**{'model.block': block, 'model.gpas': True, 'model.mix_ln_alpha': 0.5})
  base = make_model(small_config(**{'model.block': block, 'model.mix_ln_alpha': 0.5}))
  np.testing.assert_array_equal(params['blocks']['gpas_gate'], 0.0)
  base_params = dict(params, blocks={k: v for k, v in params['blocks'].items() if k != 'gpas_gate'})
  toks = tokens(small_config())  # block by block: the same ops apart from the gates
  got, want = _block_outputs(model, params, toks)[0], _block_outputs(base, base_params, toks)[0]
  if block == 'post_ln':
    np.testing.assert_array_equal(got, want)
  else:  # Mix-LN's per-layer choice is a conditional: each wiring is fused with the gate ops
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  _, per_sublayer = init(**{'model.block': block, 'model.gpas': True,
                            'model.gpas_share_per_block': False, 'model.mix_ln_alpha': 0.5})
  assert {'attn_gpas_gate', 'mlp_gpas_gate'} <= set(per_sublayer['blocks'])


def test_ngpt_hidden_states_on_sphere_and_zero_alpha_is_identity():
  model, params = init(**{'model.block': 'ngpt', 'model.mlp': 'swiglu'})
  _, outs = _block_outputs(model, params, tokens(small_config()))
  for out in outs:
    np.testing.assert_allclose(jnp.linalg.norm(out, axis=-1), 1.0, atol=1e-5)
  for name in ('attn_alpha', 'mlp_alpha'):
    params['blocks'][name] = jnp.zeros_like(params['blocks'][name])
  x = outs[0]
  np.testing.assert_allclose(_run_block(model, params, x, 1), x, atol=1e-6)


@pytest.mark.parametrize('mode', ['full', 'per_head', 'l2_learned_scale'])
def test_qk_norm_logits_invariant_to_scaling_w_q_and_w_k(mode):
  model, params = init(**{'model.qk_norm': mode})
  attn = params['blocks']['attn']
  attn['q'] = jax.random.normal(jax.random.PRNGKey(8), attn['q'].shape)  # eps negligible
  attn['kv'] = jax.random.normal(jax.random.PRNGKey(9), attn['kv'].shape)
  x = _x(10)
  ref = _attention(model, params, x)
  attn['q'] = 7.0 * attn['q']
  attn['kv'] = attn['kv'].at[:, :, 0].multiply(0.2)
  np.testing.assert_allclose(_attention(model, params, x), ref, atol=1e-4)


def test_simple_norm_every_linear_normalized_and_weight_scale_invariant():
  model, params = init(**{'model.block': 'simple_norm', 'model.mlp': 'swiglu',
                          'model.norm_eps': EPS})
  inter = _captured(model, params, _x(11), 0)
  names = {'attn': ('q_norm', 'k_norm', 'v_norm', 'o_norm'),
           'mlp': ('gate_norm', 'up_norm', 'wo_norm')}
  for sub, norms in names.items():
    for name in norms:
      np.testing.assert_allclose(token_rms(inter[sub][name]['__call__'][0]), 1.0, atol=1e-4)
  toks = tokens(small_config())
  ref = _apply(model, params, toks)[0]
  for sub, w in (('attn', 'q'), ('attn', 'kv'), ('attn', 'o'), ('mlp', 'wi'), ('mlp', 'wo')):
    params['blocks'][sub][w] = 3.0 * params['blocks'][sub][w]
  np.testing.assert_allclose(_apply(model, params, toks)[0], ref, rtol=1e-4, atol=1e-4)


def test_layer_rope_with_zero_theta_is_pre_ln_with_tied_gains():
  model, params = init(**{'model.layer_rope': True, 'model.layer_rope_theta': 0.0,
                          'model.norm': 'rmsnorm'})
  base = make_model(small_config(**{'model.norm': 'rmsnorm'}))
  gain = 1.0 + 0.3 * jax.random.normal(jax.random.PRNGKey(12), (D,))
  params['layer_rope_gain'] = gain
  tied = {'scale': jnp.tile(gain, (2, 1))}
  base_params = {'embedding': params['embedding'], 'final_norm': params['final_norm'],
                 'blocks': {'attn': params['blocks']['attn'], 'mlp': params['blocks']['mlp'],
                            'attn_norm': tied, 'mlp_norm': tied}}
  toks = tokens(small_config())
  np.testing.assert_allclose(_apply(model, params, toks)[0], _apply(base, base_params, toks)[0],
                             atol=1e-5)
  count = lambda p: sum(int(np.prod(a.shape)) for a in jax.tree.leaves(p))
  pre_ln_params = jax.eval_shape(lambda: base.init(jax.random.PRNGKey(0), toks))['params']
  assert count(params) == count(pre_ln_params) - (2 * 2 - 1) * D + 2 * 2


def test_fix_norm_and_pointwise_embedding_scale():
  model, params = init('embed', **{'model.fix_norm': True})
  assert float(jnp.abs(params['embedding']).max()) <= 0.01
  x = _apply(model, params, tokens(small_config()), Transformer.embed)
  np.testing.assert_allclose(jnp.linalg.norm(x, axis=-1), math.sqrt(D), rtol=1e-5)
  model, params = init('embed', **{'model.norm': 'dyt'})
  assert float(params['embed_scale']) == pytest.approx(math.sqrt(D))
  x = _apply(model, params, tokens(small_config()), Transformer.embed)
  np.testing.assert_allclose(x, math.sqrt(D) * params['embedding'][tokens(small_config())],
                             rtol=1e-6)
