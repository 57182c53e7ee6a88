"""Every residual design (and value residual / parallel block / MoDA, combined with them): the
scanned stack equals the unrolled loop, and 20 training steps give a finite loss, with the
blocks' share of what was learned (L = 2; the recording site on multi-stream designs is
checked in test_residual.py)."""

import jax
import numpy as np
import pytest

from depthscale import config
from depthscale.model.transformer import apply_unrolled, make_model
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step
from tests.helpers import batch_loss, tiny_config

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


@pytest.mark.parametrize('name', CASES)
def test_design_scans_and_trains(name):
  cfg = tiny_config(**{'model.num_layers': 2, 'train.steps': 20, **CASES[name]})
  config.validate(cfg)
  model, tx = make_model(cfg), make_optimizer(cfg)
  state = jax.jit(lambda: init_state(model, tx, 0, cfg.data.seq_len))()
  tokens = jax.random.randint(jax.random.PRNGKey(1), (cfg.data.batch_size, cfg.data.seq_len + 1),
                              0, cfg.model.vocab_size)
  scanned, _ = jax.jit(model.apply)({'params': state['params']}, tokens[:, :-1])
  unrolled = jax.jit(lambda p, t: apply_unrolled(model, p, t))(state['params'], tokens[:, :-1])
  np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:],
           'weights': np.ones(tokens[:, 1:].shape, np.float32)}
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
