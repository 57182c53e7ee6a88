"""Procedures on a trained model (depthscale.posthoc) against float64 numpy: layer pruning
with healing (the dropped blocks are the argmin of the angular distance, the pruned model
is the source model skipping them, healing lowers the loss), removing the norms by
fine-tuning (each frozen divisor is its norm's mean input std at its step, the model without
norms is a float64 forward with fixed scales) and least-squares maps between two models'
residual streams (R^2 of numpy's lstsq)."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from depthscale import data, storage
from depthscale.config import validate
from depthscale.errors import ConfigError
from depthscale.model import norms
from depthscale.model.transformer import make_model
from depthscale.posthoc import init_from, linear_maps, ln_free, prune
from depthscale.training.loop import train_rung
from tests.helpers import tiny_config, validates_unless

SOURCE = {'model.num_layers': 4, 'model.d_model': 16, 'model.num_heads': 2,
          'data.seq_len': 16, 'data.batch_size': 8, 'data.source': 'grammar',
          'train.steps': 40, 'train.log_every': 20, 'train.eval_every': 40,
          'train.checkpoint_every': 40, 'optim.lr': 1e-2, 'optim.warmup_steps': 4,
          'metrics.analysis_every': 0, 'metrics.images': False}


# the 9 norms of the 4-block model go at steps 2, 4, ..., 18; 4 more steps without any
LN_FREE = {'posthoc.init_from': 'L4', 'posthoc.remove_norms_every': 2,
           'posthoc.remove_norms_start': 2, 'train.steps': 22, 'train.eval_every': 22,
           'train.checkpoint_every': 22, 'optim.lr': 3e-3}


def _cfg(**overrides):
  return tiny_config(**{**SOURCE, **overrides})


@pytest.fixture(scope='module')
def ladder(tmp_path_factory):
  """A trained 4-block source rung and the rung of it pruned by 2 blocks and healed for 12
  steps: (ladder dir, pruned rung's summary)."""
  root = tmp_path_factory.mktemp('posthoc')
  train_rung(_cfg(), str(root / 'L4'))
  train_rung(_cfg(**LN_FREE), str(root / 'ln_free'), name='ln_free')
  healed = train_rung(_cfg(**{'model.num_layers': 2, 'posthoc.init_from': 'L4',
                              'posthoc.prune_layers': 2, 'train.steps': 12,
                              'train.eval_every': 12, 'train.checkpoint_every': 12,
                              'optim.lr': 3e-3}), str(root / 'pruned'), name='pruned')
  return root, healed


def _ln64(p, x, stds=None):
  """LayerNorm, or with a frozen divisor c > 0 g (x - mean) / c + b; appends the mean input
  sqrt(var + eps) to stds."""
  x = x - x.mean(-1, keepdims=True)
  std = np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5)
  if stds is not None:
    stds.append(std.mean())
  c = p.get('divisor', 0.0)
  return x / (c if c > 0 else std) * p['scale'] + p['bias']


def _rope64(x):
  t, e = x.shape[1], x.shape[-1]
  angle = np.arange(t)[:, None] * 10000.0 ** (-np.arange(0, e, 2) / e)
  cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
  x1, x2 = np.split(x, 2, axis=-1)
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _block64(p, x, stds):
  """Pre-LN block, float64: x + Attn(LN(x)), then h + W_out gelu_tanh(W_in LN(h))."""
  h = _ln64(p['attn_norm'], x, stds['attn_norm'])
  q = _rope64(np.einsum('btd,dhe->bthe', h, p['attn']['q']))
  k, v = (np.einsum('btd,dke->btke', h, p['attn']['kv'][:, i]) for i in (0, 1))
  k = _rope64(k)
  logits = np.einsum('bqhe,bkhe->bhqk', q, k) / math.sqrt(q.shape[-1])
  t = x.shape[1]
  logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  x = x + np.einsum('bqhe,hed->bqd', np.einsum('bhqk,bkhe->bqhe', probs, v), p['attn']['o'])
  u = _ln64(p['mlp_norm'], x, stds['mlp_norm']) @ p['mlp']['wi']
  g = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
  return x + g @ p['mlp']['wo']


def _forward64(params, tokens, skip=(), stds=None):
  """(streams h_0..h_L, logits) of the Pre-LN model in float64, blocks in `skip` left out;
  stds collects each norm's mean input std (per block norm a list over layers)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  stds = {'attn_norm': [], 'mlp_norm': [], 'final_norm': []} if stds is None else stds
  x = p['embedding'][np.asarray(tokens)]
  hs = [x]
  for l in range(p['blocks']['mlp']['wi'].shape[0]):
    if l not in skip:
      x = _block64(jax.tree.map(lambda a, l=l: a[l], p['blocks']), x, stds)
    hs.append(x)
  return hs, _ln64(p['final_norm'], x, stds['final_norm']) @ p['embedding'].T


def _angle64(a, b):
  """arccos(cos(a[T], b[T])) / pi on the last token, mean over sequences."""
  a, b = a[:, -1], b[:, -1]
  cos = np.sum(a * b, -1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
  return float(np.mean(np.arccos(np.clip(cos, -1, 1)) / np.pi))


def _source(root):
  src_cfg = init_from.read_config(str(root / 'L4'))
  params = init_from.restore_params(src_cfg, str(root / 'L4'), None)
  return src_cfg, params


def test_pruning_drops_the_blocks_of_least_angular_distance(ladder):
  """d(l, 2) = arccos(cos(h_l[T], h_{l+2}[T])) / pi over the eval set, float64 numpy; the
  logged distances match it and the dropped blocks are its argmin."""
  root, healed = ladder
  src_cfg, params = _source(root)
  batches = data.eval_batches(src_cfg.data, src_cfg.train.seed, src_cfg.data.eval_batches)
  d = np.zeros(3)
  for b in batches:
    hs, _ = _forward64(params, b['inputs'])
    d += [_angle64(hs[l], hs[l + 2]) for l in range(3)] / np.float64(len(batches))
  np.testing.assert_allclose(healed['prune_distances'], d, atol=2e-4)
  assert np.sort(d)[1] - np.sort(d)[0] > 1e-3, 'distances too close to tell the argmin'
  assert healed['prune_first_block'] == int(np.argmin(d)) + 1
  assert healed['prune_fraction'] == 0.5


def test_pruned_model_is_the_source_model_skipping_the_dropped_blocks(ladder):
  """Logits of the sliced parameters (first, middle and last pair dropped) equal a float64
  forward of the trained 4-block model that skips those blocks."""
  root, _ = ladder
  _, params = _source(root)
  model = make_model(_cfg(**{'model.num_layers': 2}))
  tokens = data.eval_batches(_cfg().data, 0, 1)[0]['inputs']
  apply = jax.jit(lambda p: model.apply({'params': p}, tokens)[0])
  for first in range(3):
    logits = apply(prune.drop_blocks(params, first, 2))
    _, ref = _forward64(params, tokens, skip=(first, first + 1))
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


def test_healing_lowers_the_loss_of_the_pruned_model(ladder):
  _, healed = ladder
  assert healed['posthoc_start_eval_loss'] > healed['posthoc_source_eval_loss']
  assert healed['final_eval_loss'] < healed['posthoc_start_eval_loss']


def test_linear_maps_r2_matches_numpy_lstsq(ladder):
  """R^2 of the affine least-squares map from the healed 2-block model's stream h_l to the
  4-block model's h_l' (fit on all eval batches but the last, scored on the last) equals
  numpy's float64 lstsq; the matrix is indexed by relative depth l/L, l'/L'."""
  root, _ = ladder
  result = linear_maps.fit(str(root / 'pruned'), str(root / 'L4'))
  assert result['shallow_depths'] == [0, 0.5, 1] and result['deep_depths'] == [0, .25, .5, .75, 1]
  streams = []
  for rung in ('pruned', 'L4'):
    cfg = init_from.read_config(str(root / rung))
    params = init_from.restore_params(cfg, str(root / rung), None)
    batches = data.eval_batches(cfg.data, cfg.train.seed, cfg.data.eval_batches)
    streams.append([np.stack(_forward64(params, b['inputs'])[0]) for b in batches])
  flat = lambda hs: np.concatenate([h.reshape(h.shape[0], -1, h.shape[-1]) for h in hs], 1)
  (x_fit, x_test), (y_fit, y_test) = ((flat(s[:-1]), flat(s[-1:])) for s in streams)
  r2 = np.zeros((3, 5))
  for i in range(3):
    a = np.concatenate([x_fit[i], np.ones((x_fit.shape[1], 1))], 1)
    a_test = np.concatenate([x_test[i], np.ones((x_test.shape[1], 1))], 1)
    for j in range(5):
      w = np.linalg.lstsq(a, y_fit[j], rcond=None)[0]
      resid = y_test[j] - a_test @ w
      r2[i, j] = 1 - np.sum(resid ** 2) / np.sum((y_test[j] - y_test[j].mean(0)) ** 2)
  np.testing.assert_allclose(result['r2'], r2, atol=2e-3)
  for i, best in enumerate(result['best_deep_depth']):
    assert r2[i, result['deep_depths'].index(best)] >= r2[i].max() - 2e-3


def test_a_removed_norm_divides_by_the_input_std_frozen_at_its_step(ladder):
  """The remover sets norm i's divisor to the float64 mean input sqrt(var + eps) on the
  step's batch, with the norms before it already fixed; the model then equals a float64
  forward in which those norms compute g (x - mean) / c + b and the others normalize."""
  root, _ = ladder
  cfg = _cfg(**LN_FREE)
  model = make_model(cfg)
  _, source = _source(root)
  fresh = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 16), np.int32)))
  fresh = fresh['params']
  state = {'params': init_from.overlay(fresh, source, 'L4')}
  remover = ln_free.Remover(cfg, model, state['params'])
  batch = data.eval_batches(cfg.data, 3, 1)[0]
  order = [(path[-2] if path[0] == 'blocks' else 'final_norm', l) for path, l in
           ln_free.removal_order(state['params'])]
  assert order[:4] == [('mlp_norm', l) for l in range(4)] and order[-1] == ('final_norm', None)
  for i, (name, l) in enumerate(order[:6]):
    stds = {'attn_norm': [], 'mlp_norm': [], 'final_norm': []}
    _forward64(state['params'], batch['inputs'], stds=stds)
    state = remover(state, 2 + 2 * i, batch)
    divisor = np.asarray((state['params']['blocks'] if l is not None else state['params'])
                         [name]['divisor'])
    np.testing.assert_allclose(divisor if l is None else divisor[l],
                               stds[name][0 if l is None else l], rtol=1e-5)
  assert ln_free.removed(state['params']) == 6
  logits = jax.jit(lambda p: model.apply({'params': p}, batch['inputs'])[0])(state['params'])
  np.testing.assert_allclose(logits, _forward64(state['params'], batch['inputs'])[1],
                             rtol=1e-4, atol=1e-4)


def test_norm_free_fine_tune_ends_with_every_norm_a_fixed_linear_map(ladder):
  """After the schedule every divisor is set, and the fine-tuned model equals a float64
  forward with g (x - mean) / c + b in place of each of its 9 LayerNorms."""
  root, _ = ladder
  summary = storage.read_json(str(root / 'ln_free' / 'summary.json'))
  assert summary['norms_removed'] == 9
  cfg = init_from.read_config(str(root / 'ln_free'))
  params = init_from.restore_params(cfg, str(root / 'ln_free'), None)
  assert (np.asarray(params['blocks']['attn_norm']['divisor']) > 0).all()
  batch = data.eval_batches(cfg.data, 0, 1)[0]
  logits = jax.jit(lambda p: make_model(cfg).apply({'params': p}, batch['inputs'])[0])(params)
  np.testing.assert_allclose(logits, _forward64(params, batch['inputs'])[1], rtol=1e-4, atol=1e-4)
  # the loss stated against the original: 4.001 vs 4.107 (22 steps of fine-tuning, seed 0)
  assert summary['final_eval_loss'] < summary['posthoc_source_eval_loss'] + 0.05


@pytest.mark.slow  # two more training runs
def test_a_resumed_norm_removal_run_equals_the_straight_one(ladder):
  """Killed at step 9 (4 norms removed, checkpoint at step 8) and rerun: the rung's own
  checkpoint wins over init_from and the schedule goes on; the final losses equal the
  straight run's."""
  root, _ = ladder
  cfg = _cfg(**{**LN_FREE, 'train.checkpoint_every': 4})
  path = str(root / 'ln_free_resumed')
  assert train_rung(cfg, path, stop_at_step=9)['status'] == 'stopped'
  resumed = train_rung(cfg, path)
  straight = storage.read_json(str(root / 'ln_free' / 'summary.json'))
  for key in ('final_train_loss', 'final_eval_loss', 'norms_removed', 'posthoc_start_eval_loss'):
    assert resumed[key] == straight[key], key


def test_init_from_checks_name_the_field(ladder):
  root, _ = ladder
  def check(**overrides):
    cfg = _cfg(**overrides)
    validate(cfg)
    init_from.check(cfg, str(root / 'new'))
  with pytest.raises(ConfigError, match=r'^posthoc.init_from=.*finished rung'):
    check(**{'posthoc.init_from': 'missing'})
  with pytest.raises(ConfigError, match=r'^--deep=.*finished rung'):
    linear_maps.fit(str(root / 'L4'), str(root / 'missing'))
  with pytest.raises(ConfigError, match=r'^model.d_model=32 is invalid: allowed 16'):
    check(**{'posthoc.init_from': 'L4', 'model.d_model': 32})
  with pytest.raises(ConfigError, match=r'^model.num_layers=3 is invalid: allowed 2'):
    check(**{'posthoc.init_from': 'L4', 'posthoc.prune_layers': 2, 'model.num_layers': 3})
  with pytest.raises(ConfigError, match=r'^posthoc.prune_layers=1 is invalid: allowed 0 unless'):
    validate(_cfg(**{'posthoc.prune_layers': 1}))
  with pytest.raises(ConfigError, match=r'^posthoc.prune_layers=-1 is invalid'):
    validate(_cfg(**{'posthoc.prune_layers': -1}))
  src = init_from.read_config(str(root / 'L4'))
  for field, value in (('model.ln_scaling', True), ('model.residual', 'laurel')):
    src_f = src.copy_and_resolve_references()
    section, name = field.split('.')
    src_f[section][name] = value
    cfg = _cfg(**{'posthoc.init_from': 'L4', 'posthoc.prune_layers': 1, 'model.num_layers': 3,
                  field: value})
    with pytest.raises(ConfigError, match=r'^posthoc.prune_layers=1 is invalid: allowed 0'):
      prune.check_prunable(src_f, cfg)


@pytest.mark.parametrize('overrides,message', [
    ({'model.norm': 'dyt'}, r'^model.norm=.dyt. is invalid: allowed layernorm or rmsnorm'),
    ({'model.block': 'sub_ln'}, r'^posthoc.remove_norms_every=2 is invalid: allowed 0 unless'),
    ({'optim.decay_norms': True}, r'^optim.decay_norms=True is invalid: allowed False'),
    ({'posthoc.remove_norms_start': -1}, r'^posthoc.remove_norms_start=-1 is invalid'),
    ({'train.steps': 18}, r'^posthoc.remove_norms_every=2 is invalid: allowed a value that '
                          r'removes the last of the 9 norms'),
])
def test_norm_removal_checks_name_the_field(overrides, message):
  cfg = _cfg(**{**LN_FREE, 'train.eval_every': 2, 'train.checkpoint_every': 2, **overrides})
  with pytest.raises(ConfigError, match=message):
    validate(cfg)
    ln_free.check(cfg)


@pytest.mark.parametrize('kind', sorted(norms.NORMS))
def test_norm_removal_takes_the_norms_whose_row_is_removable(kind):
  cfg = _cfg(**{**LN_FREE, 'model.norm': kind})
  removable = [name for name, row in norms.NORMS.items() if row.removable]
  validates_unless(kind not in removable, cfg, rf"^model.norm='{kind}' is invalid: allowed "
                   rf"{' or '.join(removable)} with posthoc.remove_norms_every$")
