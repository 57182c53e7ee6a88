"""train.cpu_options: the train step's XLA-CPU dot library chosen by timing, cached per host
and step (depthscale.training.cpu_calibration)."""

import json
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale import data, storage
from depthscale.config import validate
from depthscale.errors import ConfigError
from depthscale.model import ops
from depthscale.model.transformer import make_model
from depthscale.training import cpu_calibration, sharding
from depthscale.training.loop import train_rung
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step
from tests.helpers import small_config

x86 = pytest.mark.skipif(platform.machine().lower() not in ('x86_64', 'amd64'),
                         reason='oneDNN options exist on x86 hosts only')
# the suite's compilation cache cannot hold oneDNN executables (a warning per compile)
onednn_warning = pytest.mark.filterwarnings('ignore:Error writing persistent compilation cache')


def config(**overrides):
  """A tiny rung (L2, D16, T16) without analyses or images: few programs to compile."""
  return small_config(**{'train.steps': 4, 'train.log_every': 2, 'train.eval_every': 4,
                         'train.checkpoint_every': 4, 'metrics.analysis_every': 0,
                         'metrics.images': False, **overrides})


def plain_step(cfg):
  """(plan, plain step function, initial state, first batch) of a rung."""
  model, tx = make_model(cfg), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = plan.init(init_state, model, tx, cfg.train.seed, cfg.data.seq_len)
  batch = plan.global_batch(next(data.train_iterator(cfg.data, cfg.train.seed)))
  return plan, make_train_step(model, tx, schedule(cfg), cfg), state, batch


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """The cache file of this test (empty)."""
  path = str(tmp_path / 'cache' / 'cpu_options.json')
  monkeypatch.setenv(cpu_calibration.CACHE_ENV, path)
  return path


@pytest.fixture
def compiles(monkeypatch):
  """The cpu_set of every program a Plan compiles, in order."""
  seen, original = [], sharding.Plan.compile_lowered

  def counting(plan, lowered, options=None, opt_level=None, cpu_set='onednn'):
    seen.append(cpu_set)
    return original(plan, lowered, options, opt_level, cpu_set)
  monkeypatch.setattr(sharding.Plan, 'compile_lowered', counting)
  return seen


@pytest.fixture
def choice_allowed(monkeypatch):
  """A host where the step may take either set (x86, one device; the suite's compilation
  cache would rule oneDNN out), and 'auto' calibrating however short the run."""
  monkeypatch.setattr(ops, 'onednn_allowed',
                      lambda target, devices=1: target == 'cpu' and devices == 1)
  monkeypatch.setattr(cpu_calibration, 'PAYBACK_GAIN', float('inf'))


def test_timing_picks_the_faster_step_and_leaves_the_state():
  """Two real programs, one doing the other's work plus ~340 MFLOP of matmuls: the lighter
  is chosen over the heavier whichever is the default and whichever runs first in each
  round, every step runs WARMUP + TIMED times, and the state passed in is not donated or
  changed."""
  w = jnp.full((256, 256), 1e-3)
  light = jax.jit(lambda s, b: (s + b, {'loss': s.sum()}), donate_argnums=0)

  def heavy_fn(s, b):
    x = jax.lax.fori_loop(0, 10, lambda _, x: x @ w, jnp.broadcast_to(s[:, None], (256, 256)))
    return s + b, {'loss': s.sum() + x[0, 0]}
  heavy = jax.jit(heavy_fn, donate_argnums=0)
  state, batch = jnp.arange(256.0), jnp.ones(256)
  runs = {light: 0, heavy: 0}

  def counted(fn):
    def step(s, b, lr):
      del lr  # the train step's argument
      runs[fn] += 1
      return fn(s, b)
    return step
  default, other = cpu_calibration.DEFAULT, 'eigen'
  for fast, order in ((default, (default, other)), (other, (default, other)),
                      (other, (other, default))):
    steps = {n: counted(light if n == fast else heavy) for n in order}
    times = cpu_calibration.time_steps(steps, state, batch, 1e-3)
    assert all(len(t) == cpu_calibration.TIMED for t in times.values())
    assert cpu_calibration.choose(times) == fast, times
  expected = 3 * (cpu_calibration.WARMUP + cpu_calibration.TIMED)
  assert runs == {light: expected, heavy: expected}
  np.testing.assert_array_equal(state, np.arange(256.0))


def test_a_difference_within_the_noise_keeps_the_default():
  """Another set replaces the default only if each of its timed steps beat every one of
  the default's; a faster median alone (overlapping times, as on a busy host) does not."""
  default, other = cpu_calibration.DEFAULT, 'eigen'
  assert cpu_calibration.choose({default: [10.0, 11.0, 12.0], other: [8.0, 9.0, 9.5]}) == other
  assert cpu_calibration.choose({default: [10.0, 11.0, 12.0], other: [9.0, 9.5, 10.5]}) == default
  assert cpu_calibration.choose({default: [8.0, 9.0, 9.5], other: [10.0, 11.0, 12.0]}) == default


def test_auto_calibrates_only_where_a_faster_step_pays_for_it():
  """The rule: remaining steps x step time x PAYBACK_GAIN >= one more compile per other set
  plus the timed steps. A quickstart-sized rung (150 steps of 20 ms, 3 s compiles) is not
  calibrated; a long one is."""
  gain = cpu_calibration.PAYBACK_GAIN
  cost = 3.0 + 2 * (cpu_calibration.WARMUP + cpu_calibration.TIMED) * 0.02
  assert not cpu_calibration.worth_calibrating(150, 20.0, 3.0, 2)
  assert cpu_calibration.worth_calibrating(int(cost / 0.02 / gain) + 1, 20.0, 3.0, 2)
  assert not cpu_calibration.worth_calibrating(int(cost / 0.02 / gain) - 1, 20.0, 3.0, 2)


def test_cache_key_is_the_host_and_the_lowered_step():
  """The same rung gives the same key (a new process's rung finds its entry); another
  sequence length, another key."""
  keys = []
  for seq_len in (16, 16, 32):
    plan, fn, state, batch = plain_step(config(**{'data.seq_len': seq_len}))
    keys.append(cpu_calibration.cache_key(plan.lower_train_step(fn, state, batch)))
  assert keys[0] == keys[1] != keys[2]
  assert keys[0].split('-')[0] == keys[2].split('-')[0]  # one host


def test_unreadable_cache_is_ignored_with_one_warning(tmp_path, capsys):
  """A corrupt file reads as empty with one warning line and is replaced on the next write;
  a file that cannot be written costs one warning line, never the run."""
  path = str(tmp_path / 'cpu_options.json')
  for text in ('{"truncated', '[1, 2]'):
    with open(path, 'w') as f:
      f.write(text)
    assert cpu_calibration.read_cache(path) == {}
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith(f'warning: CPU options cache {path} ignored')
  assert cpu_calibration.write_cache(path, 'k', {'choice': 'eigen'})
  capsys.readouterr()
  assert cpu_calibration.read_cache(path) == {'k': {'choice': 'eigen'}}
  assert os.listdir(tmp_path) == ['cpu_options.json']  # no temporary file left
  blocked = str(tmp_path / 'cpu_options.json' / 'cache.json')  # its directory is a file
  assert not cpu_calibration.write_cache(blocked, 'k', {'choice': 'eigen'})
  err = capsys.readouterr().err
  assert err.count('\n') == 1
  assert err.startswith(f'warning: CPU options cache {blocked} not written')


def test_bad_value_is_one_line_error():
  with pytest.raises(ConfigError, match=r"^train.cpu_options='mkl' is invalid: allowed one of "
                                        r'auto, eigen, onednn$'):
    validate(config(**{'train.cpu_options': 'mkl'}))


@x86
@onednn_warning
def test_a_named_set_is_used_without_calibrating(cache, compiles, choice_allowed):
  """train.cpu_options='eigen': one compile, with the Eigen set; no timing, no cache."""
  plan, fn, state, batch = plain_step(config())
  _, record = cpu_calibration.compile_plain(plan, fn, state, batch, plan.scalar(1e-3), 'eigen', 10**6)
  assert record == {'choice': 'eigen', 'source': 'config'} and compiles == ['eigen']
  assert not os.path.exists(cache)


@x86
@onednn_warning
def test_auto_keeps_the_default_for_a_short_run(cache, compiles, monkeypatch):
  """'auto' on a run too short to pay for a calibration (worth_calibrating): the default set,
  compiled once and timed once; nothing cached."""
  monkeypatch.setattr(ops, 'onednn_allowed', lambda target, devices=1: True)
  plan, fn, state, batch = plain_step(config())
  _, record = cpu_calibration.compile_plain(plan, fn, state, batch, plan.scalar(1e-3), 'auto', 1)
  assert record['choice'] == cpu_calibration.DEFAULT and record['source'] == 'short run'
  assert compiles == [cpu_calibration.DEFAULT] and not os.path.exists(cache)


def test_no_choice_where_onednn_is_not_allowed(cache, compiles):
  """Under a compilation cache (the suite's) or on several devices the step takes the
  cacheable set: no choice, no calibration, nothing recorded."""
  assert jax.config.jax_compilation_cache_dir
  plan, fn, state, batch = plain_step(config())
  _, record = cpu_calibration.compile_plain(plan, fn, state, batch, plan.scalar(1e-3), 'auto', 10**6)
  assert record is None and len(compiles) == 1 and not os.path.exists(cache)


def _losses(workdir):
  return [r['train/loss'] for r in storage.read_jsonl(os.path.join(workdir, 'train_log.jsonl'))]


@pytest.mark.slow  # training runs, calibrated and resumed
@x86
@onednn_warning
def test_rung_calibrates_once_then_trains_as_the_forced_choice(tmp_path, cache, compiles,
                                                               choice_allowed):
  """A first rung times both sets on a copy of its state and records the choice (the
  faster, beyond the noise) in cpu_options.json, its summary and the cache; a second rung of the same shape
  takes the cached choice, compiling one program fewer; forcing the choice trains to the
  same losses as the calibrated rung (the calibration did not touch the training state or
  the data)."""
  cfg = config()
  first = train_rung(cfg, str(tmp_path / 'first'))
  record = storage.read_json(str(tmp_path / 'first' / 'cpu_options.json'))
  assert record['source'] == 'calibrated' and set(record['ms']) == set(ops.CPU_OPTION_SETS)
  assert record['choice'] == cpu_calibration.choose(record['timed_ms']) == first['cpu_options']
  with open(cache) as f:
    assert [e['choice'] for e in json.load(f).values()] == [record['choice']]
  calibrated = len(compiles)

  compiles.clear()
  train_rung(cfg, str(tmp_path / 'second'))
  again = storage.read_json(str(tmp_path / 'second' / 'cpu_options.json'))
  assert again['source'] == 'cache' and again['ms'] == record['ms']
  assert len(compiles) == calibrated - 1 and compiles[:2] == [record['choice']] * 2  # the steps

  compiles.clear()
  forced = cfg.copy_and_resolve_references()
  forced.train.cpu_options = record['choice']
  train_rung(forced, str(tmp_path / 'forced'))
  assert len(compiles) == calibrated - 1
  np.testing.assert_allclose(_losses(tmp_path / 'forced'), _losses(tmp_path / 'first'),
                             rtol=1e-6)



@pytest.mark.slow  # training runs, calibrated and resumed
@x86
@onednn_warning
def test_a_resumed_rung_keeps_its_recorded_choice(tmp_path, cache, compiles, choice_allowed):
  """A rung resumed from a checkpoint compiles the choice its cpu_options.json records,
  neither timing again nor reading the cache (deleted here), so it goes on computing what
  it computed; the record of the calibration stays."""
  cfg = config(**{'train.checkpoint_every': 2})
  workdir = str(tmp_path / 'rung')
  train_rung(cfg, workdir, stop_at_step=3)
  record = storage.read_json(os.path.join(workdir, 'cpu_options.json'))
  assert record['source'] == 'calibrated'
  os.remove(cache)
  compiles.clear()
  summary = train_rung(cfg, workdir)
  assert compiles[:2] == [record['choice']] * 2 and summary['cpu_options'] == record['choice']
  assert storage.read_json(os.path.join(workdir, 'cpu_options.json')) == record
  assert not os.path.exists(cache)
