"""Trainer: per-layer metrics vs an outside computation, bitwise resume, non-finite stop."""

import json
import os

import jax
import numpy as np
import optax
import pytest

from depthscale import data
from depthscale.model.transformer import make_model
from depthscale.training.loop import NonFiniteError, train_rung
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state, weighted_loss
from depthscale.training.writers import read_jsonl
from tests.helpers import tiny_config


def test_layer_grad_norm_matches_a_float64_norm(tmp_path):
  cfg = tiny_config(**{'train.steps': 1})
  train_rung(cfg, str(tmp_path))
  logged = read_jsonl(tmp_path / 'layer_metrics.jsonl')[0]
  assert logged['step'] == 0 and len(logged['grad_norm']) == cfg.model.num_layers

  model = make_model(cfg)
  params = init_state(model, make_optimizer(cfg), cfg.train.seed, cfg.data.seq_len)['params']
  batch = next(data.train_iterator(cfg.data, cfg.train.seed))
  grads = jax.jit(jax.grad(lambda p: weighted_loss(model.apply({'params': p}, batch['inputs'])[0],
                                                   batch)))(params)
  expected = [np.sqrt(sum(np.sum(np.asarray(g[l], np.float64) ** 2)
                          for g in jax.tree.leaves(grads['blocks'])))
              for l in range(cfg.model.num_layers)]
  np.testing.assert_allclose(logged['grad_norm'], expected, rtol=1e-4)


def test_resume_after_kill_is_bitwise_identical(tmp_path):
  cfg = tiny_config(**{'train.log_every': 1})
  full = train_rung(cfg, str(tmp_path / 'full'))
  stopped = train_rung(cfg, str(tmp_path / 'killed'), stop_at_step=3)
  assert stopped == {'status': 'stopped', 'step': 3}
  assert not (tmp_path / 'killed' / 'summary.json').exists()
  resumed = train_rung(cfg, str(tmp_path / 'killed'))
  for f in ('train_log.jsonl', 'layer_metrics.jsonl', 'eval_log.jsonl'):
    a, b = read_jsonl(tmp_path / 'full' / f), read_jsonl(tmp_path / 'killed' / f)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith('perf/')} for r in rs]
    assert strip(a) == strip(b), f
  assert [r['step'] for r in read_jsonl(tmp_path / 'killed' / 'train_log.jsonl')] == list(range(6))
  for k in ('final_train_loss', 'final_eval_loss', 'params', 'tokens', 'steps'):
    assert full[k] == resumed[k]
  # A finished rung is skipped: the same call returns the stored summary.
  assert train_rung(cfg, str(tmp_path / 'killed')) == json.loads(
      (tmp_path / 'killed' / 'summary.json').read_text())


def test_non_finite_stops_and_keeps_last_good_checkpoint(tmp_path):
  cfg = tiny_config(**{'optim.lr': 1e38, 'optim.clip_norm': 0.0, 'optim.warmup_steps': 0,
                       'optim.schedule': 'constant', 'train.checkpoint_every': 1,
                       'train.steps': 20})
  with pytest.raises(NonFiniteError, match=r'non-finite loss or gradient at step (\d+)'):
    train_rung(cfg, str(tmp_path))
  ckpts = sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())
  assert ckpts, 'the last good checkpoint must be kept'
  assert not (tmp_path / 'summary.json').exists()


def test_schedules_warm_up_then_decay():
  from depthscale.training.optim import schedule
  for name in ('constant', 'cosine', 'linear', 'wsd'):
    cfg = tiny_config(**{'optim.schedule': name, 'train.steps': 100, 'optim.warmup_steps': 10})
    lr = schedule(cfg)
    assert float(lr(0)) == 0.0
    assert float(lr(10)) == pytest.approx(cfg.optim.lr)
    final = float(lr(100))
    expect = cfg.optim.lr if name == 'constant' else cfg.optim.lr * cfg.optim.min_lr_ratio
    assert final == pytest.approx(expect, rel=1e-4)
  wsd = schedule(tiny_config(**{'optim.schedule': 'wsd', 'train.steps': 100, 'optim.warmup_steps': 10}))
  assert float(wsd(79)) == pytest.approx(tiny_config().optim.lr)


def test_weight_decay_mask():
  from depthscale.training.optim import decay_mask
  cfg = tiny_config()
  params = init_state(make_model(cfg), optax.identity(), 0, cfg.data.seq_len)['params']
  mask = decay_mask(cfg, params)
  assert mask['blocks']['attn']['q'] and mask['blocks']['mlp']['wo']
  assert not mask['embedding'] and not mask['final_norm']['scale']
  assert not mask['blocks']['attn_norm']['bias']


# config -> scalar / vector parameters (tree paths) without 'norm' in their names
NO_DECAY_CASES = {
    'gpas+dyt': ({'model.block': 'post_ln', 'model.gpas': True, 'model.gpas_share_per_block': False,
                  'model.norm': 'dyt'}, ["['blocks']['attn_gpas_gate']", "['embed_scale']"]),
    'normformer': ({'model.block': 'normformer', 'model.normformer_resid_scale': True},
                   ["['blocks']['attn']['head_scale']", "['blocks']['mlp_resid_scale']"]),
    'ngpt': ({'model.block': 'ngpt', 'model.mlp': 'swiglu', 'model.tie_embeddings': False},
             ["['blocks']['attn_alpha']", "['blocks']['mlp_alpha']",
              "['blocks']['attn']['qk_scale']", "['blocks']['mlp']['uv_scale']", "['logit_scale']"]),
    'layer_rope+henry': ({'model.layer_rope': True, 'model.qk_norm': 'l2_learned_scale',
                          'model.parametrization': 'mup'},
                         ["['layer_rope_gain']", "['blocks']['attn']['qk_scale']"]),
}


@pytest.mark.parametrize('case', list(NO_DECAY_CASES))
def test_weight_decay_only_on_matrices(case):
  """No parameter with per-layer rank < 2 (the leading axis under 'blocks' is the layer axis)
  decays; hidden matrices do, and they alone form muP's 'hidden_matrix' group."""
  from depthscale.training.optim import decay_mask
  from depthscale.model.param_tree import param_group, per_layer_rank
  overrides, named = NO_DECAY_CASES[case]
  cfg = tiny_config(**overrides)
  model = make_model(cfg)
  params = jax.eval_shape(
      lambda: init_state(model, optax.identity(), 0, cfg.data.seq_len))['params']
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  mask = jax.tree.leaves(decay_mask(cfg, params))
  decays = dict(zip((jax.tree_util.keystr(p) for p, _ in leaves), mask))
  no_decay = {name for name, d in decays.items() if not d}
  assert set(named) <= no_decay, set(named) - no_decay
  for path, leaf in leaves:
    name = jax.tree_util.keystr(path)
    if per_layer_rank(path, leaf) < 2:
      assert name in no_decay, name
    if name.startswith("['blocks']"):
      assert (param_group(path, leaf) == 'hidden_matrix') == decays[name], name
  for name in ('q', 'kv', 'o'):
    assert decays[f"['blocks']['attn']['{name}']"]
