"""Config paths the other tests leave at their defaults: rematerialization (same gradients,
less memory), bfloat16 compute (float32 master weights, the float32 loss to bf16 rounding)
and the number of checkpoints kept."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model.transformer import make_model
from depthscale.training.checkpoint import Checkpointer
from depthscale.training.steps import model_loss
from tests.helpers import tiny_config


def _loss_and_grads(cfg, params=None):
  """(loss, grads, params, compiled) of the LM loss on a fixed random batch."""
  model = make_model(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.data.batch_size, cfg.data.seq_len + 1),
                              0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': jnp.ones(tokens[:, 1:].shape, jnp.float32)}
  if params is None:
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch['inputs'])['params']
  fn = jax.jit(jax.value_and_grad(
      lambda p: model_loss(model, None, p, batch, 0, jax.random.PRNGKey(0))[0]))
  compiled = fn.lower(params).compile()
  loss, grads = compiled(params)
  return float(loss), grads, params, compiled


@pytest.mark.parametrize('unroll', [0, 16], ids=['rolled', 'unroll_asked'])
def test_remat_keeps_the_gradients_and_saves_activation_memory(unroll):
  """Also where unrolling is asked for: a rematerialized stack stays rolled (unrolled,
  XLA-CPU compiled it to the same buffers as without remat)."""
  base = {'model.num_layers': 4, 'model.d_model': 64, 'data.batch_size': 8,
          'model.unroll_max_layers': unroll}
  loss, grads, params, plain = _loss_and_grads(tiny_config(**base))
  loss_r, grads_r, _, remat = _loss_and_grads(
      tiny_config(**base, **{'model.remat': 'nothing_saveable'}), params)
  assert loss_r == pytest.approx(loss, rel=1e-6)
  for g, g_r in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_r)):
    np.testing.assert_allclose(g_r, g, rtol=1e-4, atol=1e-6)
  temp = lambda c: c.memory_analysis().temp_size_in_bytes
  assert temp(remat) < 0.8 * temp(plain), (temp(remat), temp(plain))


def test_bfloat16_computes_in_bf16_with_float32_weights_and_loss():
  loss, grads, params, _ = _loss_and_grads(tiny_config())
  loss_bf, grads_bf, _, _ = _loss_and_grads(tiny_config(**{'model.dtype': 'bfloat16'}), params)
  bf_params = make_model(tiny_config(**{'model.dtype': 'bfloat16'})).init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))['params']
  assert {x.dtype for x in jax.tree.leaves(bf_params)} == {jnp.dtype(jnp.float32)}
  assert {g.dtype for g in jax.tree.leaves(grads_bf)} == {jnp.dtype(jnp.float32)}
  assert loss_bf != loss and abs(loss_bf - loss) < 0.02 * loss  # rounded, not recomputed in f32
  flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
  g, g_bf = flat(grads), flat(grads_bf)
  assert g @ g_bf / (np.linalg.norm(g) * np.linalg.norm(g_bf)) > 0.99


def test_only_the_newest_keep_checkpoints_stay(tmp_path):
  ckpt = Checkpointer(str(tmp_path), keep=2)
  state = {'w': jnp.arange(4.0)}
  for step in (2, 4, 6):
    ckpt.save(step, jax.tree.map(lambda x: x * step, state), {'step': step})
  ckpt.wait()
  assert sorted(int(d) for d in os.listdir(tmp_path) if d.isdigit()) == [4, 6]
  step, restored, data = ckpt.restore_latest(state)
  assert step == 6 and data == {'step': 6}
  np.testing.assert_array_equal(restored['w'], 6 * np.arange(4.0))
  ckpt.close()
