"""Every residual design (and value residual / parallel block / MoDA, combined with them): the
scanned stack equals the unrolled loop, and (slow tier) 20 training steps give a finite loss,
with the blocks' share of what was learned (L = 2; the recording site on multi-stream designs
is checked in test_residual.py). The designs that carry a history (AttnRes, DenseFormer): their
gradients equal autodiff of the layer scan, and their train-step memory is linear in depth."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale import config
from depthscale.model.transformer import apply_unrolled, make_model, scan_inputs
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step, model_loss
from tests.helpers import batch_loss, perturb, tiny_config

CASES = {
    'hc_dynamic+satformer': {'model.residual': 'hyper_connections', 'model.value_residual': 'satformer'},
    'hc_static+neox': {'model.residual': 'hyper_connections', 'model.hc_dynamic': False,
                       'model.parallel_block': 'neox'},
    'mhc+resformer': {'model.residual': 'mhc', 'model.value_residual': 'resformer'},
    'denseformer_2x2+svformer': {'model.residual': 'denseformer', 'model.dwa_dilation': 2,
                                 'model.dwa_period': 2, 'model.value_residual': 'svformer'},
    'attn_res+gptj': {'model.residual': 'attn_res', 'model.parallel_block': 'gptj'},
    'block_attn_res_N3': {'model.residual': 'block_attn_res', 'model.attn_res_blocks': 3},
    'laurel_rw_lr': {'model.residual': 'laurel', 'model.laurel': 'rw_lr'},
    'laurel_pa': {'model.residual': 'laurel', 'model.laurel': 'pa'},
    'moda': {'model.moda': True},
    'moda+post_ln+gqa': {'model.moda': True, 'model.block': 'post_ln', 'model.num_kv_heads': 1},
}


def _case(name: str):
  """(cfg, model, optimizer, initial state, a batch of random tokens) of a case at L = 2."""
  cfg = tiny_config(**{'model.num_layers': 2, 'train.steps': 20, **CASES[name]})
  config.validate(cfg)
  model, tx = make_model(cfg), make_optimizer(cfg)
  state = jax.jit(lambda: init_state(model, tx, 0, cfg.data.seq_len))()
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.data.batch_size, cfg.data.seq_len + 1),
                              0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': np.ones(tokens[:, 1:].shape, np.float32)}
  return cfg, model, tx, state, batch


@pytest.mark.parametrize('name', CASES)
def test_design_scan_equals_unrolled(name):
  _, model, _, state, batch = _case(name)
  params = perturb(state['params'])  # gates, scales and mixing weights off their init
  scanned, _ = jax.jit(model.apply)({'params': params}, batch['inputs'])
  unrolled = jax.jit(lambda p, t: apply_unrolled(model, p, t))(params, batch['inputs'])
  assert np.all(np.isfinite(scanned))
  np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 20 training steps per case
@pytest.mark.parametrize('name', CASES)
def test_design_trains(name):
  cfg, model, tx, state, batch = _case(name)
  step = jax.jit(make_train_step(model, tx, schedule(cfg)))
  init_blocks, losses = state['params']['blocks'], []
  for _ in range(cfg.train.steps):
    state, out = step(state, batch)
    losses.append(float(out['loss']))
  assert bool(out['ok']) and np.all(np.isfinite(losses)), losses
  # one batch, 20 steps: it memorizes, and the blocks' share shows when they are reset to
  # their init (measured +0.25 nats for every Pre-LN design, +0.056 for Post-LN, whose
  # blocks learn slowly at first; the embedding learns the rest)
  loss, trained = batch_loss(model, batch), state['params']
  share = loss({**trained, 'blocks': init_blocks}) - loss(trained)
  assert share > (0.03 if CASES[name].get('model.block') == 'post_ln' else 0.1), share


HISTORY_CASES = {  # block AttnRes, N = 2 at L = 3: layers 2 and 3 enter with a partial block sum
    'attn_res': {'model.residual': 'attn_res'},
    'block_attn_res_N2': {'model.residual': 'block_attn_res', 'model.attn_res_blocks': 2},
    'denseformer_2x2+svformer': CASES['denseformer_2x2+svformer'],
}


def _history_cfg(name: str):
  return tiny_config(**{'model.num_layers': 3, 'model.unroll_max_layers': 0, **HISTORY_CASES[name]})


@functools.lru_cache(maxsize=None)
def _history_params(name: str):
  """A history case's init, every mixing weight away from it (the same with and without
  collect_stats: built once for both)."""
  cfg = _history_cfg(name)
  model, tx = make_model(cfg), make_optimizer(cfg)
  return perturb(jax.jit(lambda: init_state(model, tx, 0, cfg.data.seq_len)['params'])(), seed=2)


def _scan_autodiff(m, tokens_BxT):
  """The model with its layer scan differentiated by JAX (nn.scan, no history_scan)."""
  carry, stats = m.blocks(m.start(m.embed(tokens_BxT)), scan_inputs(m.cfg, None))
  return m.unembed(m.finish(carry)), stats


@pytest.mark.parametrize('collect_stats', [False, True])
@pytest.mark.parametrize('name', HISTORY_CASES)
def test_history_gradients_equal_autodiff_of_the_layer_scan(name, collect_stats):
  """history_scan's backward (history rebuilt, blocks recomputed) gives nn.scan's gradients,
  through the logits, the per-layer statistics and the sown block outputs (LayerSkip)."""
  cfg = _history_cfg(name)
  model, params = make_model(cfg, collect_stats), _history_params(name)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)

  def loss(p, method):
    (logits, stats), sown = model.apply({'params': p}, tokens, method=method,
                                        mutable=['intermediates'])
    x_out = sown['intermediates']['blocks']['x_out'][0]
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()
    return ce + jnp.mean(x_out ** 2) + sum(jnp.mean(s) for s in jax.tree.leaves(stats)) / 100

  ours = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)
  ref = jax.jit(jax.value_and_grad(lambda p: loss(p, _scan_autodiff)))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), ours, ref)


def _train_temp_bytes(overrides: dict, layers: int) -> float:
  """Temporaries of the compiled (rolled-scan) loss gradient on this host's CPU."""
  cfg = tiny_config(**{'model.num_layers': layers, 'model.unroll_max_layers': 0, **overrides})
  model, tx = make_model(cfg), make_optimizer(cfg)
  params = jax.eval_shape(lambda: init_state(model, tx, 0, cfg.data.seq_len))['params']
  tokens = jax.ShapeDtypeStruct((cfg.data.batch_size, cfg.data.seq_len), jnp.int32)
  batch = {'inputs': tokens, 'targets': tokens,
           'weights': jax.ShapeDtypeStruct(tokens.shape, jnp.float32)}
  grad = jax.jit(jax.grad(lambda p, b: model_loss(model, None, p, b, 0, None)[0]))
  return grad.lower(params, batch).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize('design', ['attn_res', 'denseformer'])
def test_history_memory_is_linear_in_depth(design):
  """Train-step temporaries at L = 4, 8, 12 lie on a line: their second difference is below
  8 history slots (B x T x D each; measured 0 for AttnRes, 2.9 for DenseFormer), where keeping
  every layer's history (nn.scan's autodiff) adds at least 2 x 4^2 = 32 (measured 397, 38)."""
  temp = [_train_temp_bytes({'model.residual': design}, layers) for layers in (4, 8, 12)]
  cfg = tiny_config()
  slot_bytes = cfg.data.batch_size * cfg.data.seq_len * cfg.model.d_model * 4  # float32
  assert abs(temp[2] - 2 * temp[1] + temp[0]) < 8 * slot_bytes, [t / slot_bytes for t in temp]
