"""Trainer: per-layer metrics vs an outside computation, bitwise resume, non-finite stop."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale import data
from depthscale.model.transformer import make_model
from depthscale.training import dryrun, programs, sharding
from depthscale.training.loop import NonFiniteError, evaluate, train_rung
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_eval_step, make_train_step, weighted_loss
from depthscale.storage import read_jsonl
from tests import compile_options_worker as worker
from tests.helpers import tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_layer_grad_norm_matches_a_float64_norm(one_step_rung):
  cfg, path = one_step_rung
  logged = read_jsonl(path / 'layer_metrics.jsonl')[0]
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


@pytest.mark.slow  # three training runs (resumes stay quick in test_reliability.py)
def test_resume_after_kill_is_bitwise_identical(tmp_path):
  """Every log, the periodic analyses (every 2 steps) included, equals the straight run."""
  cfg = tiny_config(**{'train.log_every': 1, 'metrics.analysis_every': 2})
  full = train_rung(cfg, str(tmp_path / 'full'))
  stopped = train_rung(cfg, str(tmp_path / 'killed'), stop_at_step=3)
  assert stopped == {'status': 'stopped', 'step': 3}
  assert not (tmp_path / 'killed' / 'summary.json').exists()
  resumed = train_rung(cfg, str(tmp_path / 'killed'))
  assert [r['step'] for r in read_jsonl(tmp_path / 'full' / 'analysis_log.jsonl')] == [0, 2, 4, 5]
  for f in ('train_log.jsonl', 'layer_metrics.jsonl', 'eval_log.jsonl', 'analysis_log.jsonl'):
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


def _lowered_step(**changes) -> str:
  """The text of the trainer's train step of tiny_config(**changes), lowered on abstract
  arrays as the loop lowers it."""
  cfg = tiny_config(**changes)
  model, tx = make_model(cfg), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       plan.abstract_state, plan.state)
  step = make_train_step(model, tx, schedule(cfg), cfg)
  return plan.lower_train_step(step, state, dryrun.abstract_batch(cfg, plan)).as_text()


@pytest.mark.parametrize('method', [{}, {'optim.name': 'muon'},
                                    {'optim.llr': True, 'train.layerdrop': 0.1}],
                         ids=['adamw', 'muon', 'llr+layerdrop'])
def test_every_rate_and_seed_of_a_sweep_lowers_to_one_train_step(method):
  """The peak learning rate and the seed are arguments of the compiled train step, not
  constants, with either optimizer, LR multipliers and per-step random drops: rungs that
  differ only there lower to one program (their ladder compiles it once,
  depthscale.program_cache; one process builds it once, depthscale.training.programs) and
  program_key says so; another warmup is another program and another key."""
  variants = [method, {**method, 'optim.lr': 0.03, 'train.seed': 7}]
  if not method:
    variants.append({'optim.warmup_steps': 3})
  texts = [_lowered_step(**v) for v in variants]
  keys = [programs.program_key(tiny_config(**v)) for v in variants]
  assert texts[0] == texts[1] and keys[0] == keys[1]
  if len(variants) == 3:
    assert texts[2] != texts[0] and keys[2] != keys[0]


def test_a_process_keeps_one_object_per_program_key_name_and_platform():
  """programs.kept builds once for configs that differ only in STEP_ARGUMENTS, again for
  another key or name, and drops the least recently used beyond KEEP."""
  built = []
  build = lambda: built.append(object()) or built[-1]
  programs.clear()
  first = programs.kept(tiny_config(), 'x', build)
  assert programs.kept(tiny_config(**{'optim.lr': 0.03, 'train.seed': 7}), 'x', build) is first
  assert programs.kept(tiny_config(**{'optim.warmup_steps': 3}), 'x', build) is not first
  assert programs.kept(tiny_config(), 'y', build) is not first and len(built) == 3
  programs.clear()
  cfg = tiny_config()
  kept = [programs.kept(cfg, name, build) for name in range(programs.KEEP)]
  assert programs.kept(cfg, 0, build) is kept[0]  # now the most recently used
  programs.kept(cfg, 'one more', build)
  assert programs.kept(cfg, 0, build) is kept[0] and programs.kept(cfg, 1, build) is not kept[1]
  programs.clear()


def test_the_rate_as_an_argument_trains_as_the_rate_as_a_constant():
  """Three steps with the peak rate passed as an array equal three steps with optim.lr
  compiled in (logged rates equal, parameters to float32 rounding); twice the rate logs twice
  the rate and moves the parameters elsewhere."""
  cfg = tiny_config(**{'optim.lr': 0.01, 'optim.warmup_steps': 2})
  model, tx = make_model(cfg), make_optimizer(cfg)
  step = jax.jit(make_train_step(model, tx, schedule(cfg), cfg))
  batch = next(data.train_iterator(cfg.data, cfg.train.seed))
  runs = {}
  for name, lr in (('constant', None), ('argument', jnp.float32(0.01)),
                   ('double', jnp.float32(0.02))):
    state, lrs = init_state(model, tx, cfg.train.seed, cfg.data.seq_len), []
    for _ in range(3):
      state, out = step(state, batch, lr)
      lrs.append(float(out['lr']))
    runs[name] = (jax.device_get(state['params']), lrs)
  assert runs['constant'][1] == runs['argument'][1] == pytest.approx([0.0, 0.005, 0.01], rel=1e-6)
  assert runs['double'][1] == pytest.approx([0.0, 0.01, 0.02], rel=1e-6)
  diff = lambda other: max(jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(a - b))), runs['constant'][0], runs[other][0])))
  # float32 rounding (XLA folds a constant rate into other factors), amplified where Adam
  # divides tiny gradients: within 2e-4 of a step's size (0.01); the double rate moves more
  assert diff('argument') < 2e-6 and diff('double') > 1e-3, (diff('argument'), diff('double'))


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


def test_eval_loss_and_hop_accuracy_match_a_float64_count_over_two_batches():
  """eval/loss = sum of weighted CE / sum of weights over the whole eval set (not a mean of
  batch means: the batches' weight sums differ); acc_hop<k> = correct answers / answers
  at hop k, counted by hand."""
  cfg = tiny_config(**{'data.source': 'mix'})
  model = make_model(cfg)
  params = init_state(model, optax.identity(), 1, cfg.data.seq_len)['params']
  batches = data.eval_batches(cfg.data, cfg.train.seed, 2)
  batches[1]['weights'] = batches[1]['weights'] * (np.arange(cfg.data.seq_len) % 3 == 0)
  for b in batches:  # every other answer made correct: counts strictly between 0 and all
    pred = np.asarray(model.apply({'params': params}, b['inputs'])[0]).argmax(-1)
    flip = (b['hop'] > 0) & (np.cumsum(b['hop'] > 0).reshape(b['hop'].shape) % 2 == 0)
    b['targets'] = np.where(flip, pred, b['targets'])
  hops = data.hop_values(cfg.data)
  got = evaluate(jax.jit(make_eval_step(model, hops, cfg)), params, batches, hops,
                 np.int32(0))
  nll = w = 0.0
  correct, count = np.zeros(len(hops)), np.zeros(len(hops))
  for b in batches:
    logits = np.asarray(model.apply({'params': params}, b['inputs'])[0], np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    ce = -np.take_along_axis(logp, b['targets'][..., None], -1)[..., 0]
    nll, w = nll + (ce * b['weights']).sum(), w + b['weights'].sum()
    for i, k in enumerate(hops):
      at = b['hop'] == k
      correct[i] += np.sum(at & (logits.argmax(-1) == b['targets']))
      count[i] += np.sum(at)
  assert count.min() > 0 and np.all(correct > 0) and np.all(correct < count)
  assert got['eval/loss'] == pytest.approx(nll / w, rel=1e-5)
  for i, k in enumerate(hops):
    assert got[f'eval/acc_hop{k}'] == pytest.approx(correct[i] / count[i], abs=1e-7)


def assert_close(actual, expected, rtol: float, atol: float = 0.0, path: str = ''):
  """Every number of two equal-shaped JSON trees within tolerance (the path names a failure)."""
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for k in expected:
      assert_close(actual[k], expected[k], rtol, atol, f'{path}/{k}')
  else:
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=path)


def assert_plain_close(actual, expected):
  assert actual['loss'] == pytest.approx(expected['loss'], rel=1e-5)
  assert actual['grad_norm'] == pytest.approx(expected['grad_norm'], rel=1e-4)


@pytest.mark.slow  # a subprocess compiling every program with XLA's default options
@pytest.mark.filterwarnings('ignore:Error writing persistent compilation cache')
def test_user_xla_flags_compute_what_the_suite_flags_do():
  """The suite compiles at -O0 without fusion emitters, from a compilation cache (so without
  the oneDNN options, ops.compiler_options); a user's process has XLA's defaults and no
  cache. One such process (tests/compile_options_worker.py, 2 fake host devices) runs the
  plain step (layer scan unrolled, and rolled), the statistics step (loss, per-layer
  statistics), its optimizer update, eval, and the statistics step, update and eval sharded
  over the 2 devices (fsdp): each equals this process's one-device programs within float32
  rounding. The compilers order and fuse float32 sums differently (and oneDNN has its own
  dot kernels): the loss, a mean over 512 tokens, moved by ~1e-7 relative (rtol 1e-5);
  norms and per-layer statistics (reductions of squares, ratios and cosines of them) by up
  to 3e-6 (a cosine of 1e-3; rtol 1e-4). The update is Adam's first, lr * g / (|g| + eps):
  +-lr wherever |g| >> eps, and up to 3e-4 lr apart where |g| ~ eps, so elements are
  compared to 1e-2 lr absolute (a missing or different update is off by ~lr)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('JAX_') and k != 'XLA_FLAGS'}
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [ROOT, env.get('PYTHONPATH')]))
  proc = subprocess.run([sys.executable, '-m', 'tests.compile_options_worker'], env=env,
                        capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-4000:]
  user = json.loads(proc.stdout.split('RESULT ', 1)[1])
  one = jax.devices()[:1]
  suite = worker.programs(worker.UNROLLED, one)
  rolled = worker.programs(worker.ROLLED, one, stats=False)['plain']
  lr = suite['stats']['lr']
  assert lr > 0 and np.max(np.abs(jax.tree.leaves(suite['update']))) > 0.5 * lr  # it updated
  for got in (user['unrolled'], user['sharded']):
    if 'plain' in got:
      assert_plain_close(got['plain'], suite['plain'])
    assert_close(got['stats']['loss'], suite['stats']['loss'], rtol=1e-5)
    assert_close(got['stats'], suite['stats'], rtol=1e-4, atol=1e-7)
    assert_close(got['update'], suite['update'], rtol=0, atol=1e-2 * lr)
    for g, s in zip(got['eval'], suite['eval'], strict=True):
      assert_close(g['loss_sum'], s['loss_sum'], rtol=1e-5)
      assert g['weight_sum'] == s['weight_sum'] and g['count'] == s['count']
      assert_close(g['correct'], s['correct'], rtol=0, atol=1)  # an argmax may flip on a tie
  assert_plain_close(user['rolled'], rolled)
  assert_plain_close(user['rolled'], suite['plain'])  # rolled or unrolled: one function
