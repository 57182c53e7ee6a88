"""Preemption-proof rungs: kills at any point resume bitwise, unreadable checkpoints fall
back, a rung killed before its summary finishes from its checkpoint, TensorBoard shows one
curve after a resume, config changes on resume are checked, bad input fails before
anything is written, and rerun-read files are written atomically."""

import collections
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale import data, storage
from depthscale.errors import ConfigError
from depthscale.model.transformer import make_model
from depthscale.results.loader import tensorboard_duplicates
from depthscale.training import programs, resume
from depthscale.training.checkpoint import Checkpointer, UnreadableCheckpoints, abstract
from depthscale.training.loop import train_rung
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state
from depthscale.storage import read_jsonl
from depthscale.training.writers import Jsonl
from tests.helpers import tiny_config

LOGS = ('train_log.jsonl', 'layer_metrics.jsonl', 'eval_log.jsonl')
TIMING = ('compile_s', 'tokens_per_sec')


def _config(**overrides):
  """6 steps, logs every step, eval and checkpoint every 2: checkpoints at 2, 4, 6."""
  return tiny_config(**{'train.log_every': 1, 'train.eval_every': 2, **overrides})


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """An uninterrupted run: (directory, summary)."""
  d = tmp_path_factory.mktemp('reference')
  return d, train_rung(_config(), str(d))


@pytest.fixture(scope='module')
def killed(tmp_path_factory):
  """A run stopped before step 5: checkpoints at 2 and 4, logs of steps 0..4."""
  d = tmp_path_factory.mktemp('killed')
  assert train_rung(_config(), str(d), stop_at_step=5) == {'status': 'stopped', 'step': 5}
  return d


def _strip(records):
  return [{k: v for k, v in r.items() if not k.startswith('perf/')} for r in records]


def _assert_same_run(a, b):
  """Logs and TensorBoard curves of two rung directories agree value for value."""
  for f in LOGS:
    assert _strip(read_jsonl(a / f)) == _strip(read_jsonl(b / f)), f
  assert tensorboard_duplicates(str(b)) == {}
  acc = EventAccumulator(str(b))
  acc.Reload()
  for f, tag in (('train_log.jsonl', 'train/loss'), ('eval_log.jsonl', 'eval/loss')):
    assert [(e.step, e.value) for e in acc.Scalars(tag)] == [
        (r['step'], r[tag]) for r in read_jsonl(a / f)], tag


def _assert_same_summary(a: dict, b: dict):
  assert set(a) == set(b)
  same = lambda x, y: x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
  assert all(same(a[k], b[k]) for k in a if k not in TIMING), (a, b)
  # NaN only where it is defined (effective_depth/cos: no sign change of the mean cosine)
  assert all(math.isfinite(v) for k, v in b.items() if isinstance(v, float)
             and 'effective_depth_cos' not in k), b


def test_kill_before_first_checkpoint_then_after_one_resumes_bitwise(reference, tmp_path):
  """Two kills (before any checkpoint, then past the one at step 4), then a full rerun:
  logs, summary and TensorBoard as uninterrupted, one TensorBoard point per step."""
  ref_dir, ref_summary = reference
  cfg = _config()
  assert train_rung(cfg, str(tmp_path), stop_at_step=1)['status'] == 'stopped'
  assert not glob.glob(str(tmp_path / 'checkpoints' / '[0-9]*'))
  assert train_rung(cfg, str(tmp_path), stop_at_step=5)['status'] == 'stopped'
  _assert_same_summary(ref_summary, train_rung(cfg, str(tmp_path)))
  _assert_same_run(ref_dir, tmp_path)


def test_kill_between_final_checkpoint_and_summary(reference, tmp_path):
  """The rerun restores the final checkpoint, runs no step, and writes the summary of an
  uninterrupted run (eval recomputed from the checkpoint; no NaN)."""
  ref_dir, ref_summary = reference
  cfg = _config()
  assert train_rung(cfg, str(tmp_path), stop_at_step=6) == {'status': 'stopped', 'step': 6}
  assert not (tmp_path / 'summary.json').exists()
  logged = (tmp_path / 'train_log.jsonl').read_text()
  summary = train_rung(cfg, str(tmp_path))
  _assert_same_summary(ref_summary, summary)
  assert json.loads((tmp_path / 'summary.json').read_text()) == summary
  assert (tmp_path / 'train_log.jsonl').read_text() == logged  # no step ran again
  _assert_same_run(ref_dir, tmp_path)

  # A longer train.steps trains on from the final checkpoint; config.json keeps the history.
  longer = _config(**{'train.eval_every': 4, 'train.steps': 8})
  assert train_rung(longer, str(tmp_path))['steps'] == 8
  assert [r['step'] for r in read_jsonl(tmp_path / 'train_log.jsonl')] == list(range(8))
  (record,) = read_jsonl(tmp_path / resume.HISTORY)
  assert record['step'] == 6 and record['changes'] == {'train.eval_every': [2, 4],
                                                       'train.steps': [6, 8]}
  assert json.loads((tmp_path / 'config.json').read_text())['train']['steps'] == 8


DAMAGE = ('truncated_files', 'missing_shard', 'corrupt_metadata')


def test_a_rung_after_another_of_its_process_builds_nothing_and_ends_as_alone(
    reference, tmp_path, monkeypatch):
  """depthscale.training.programs: after a rung, a rung of the same process at another rate
  and seed lowers and compiles nothing, and its logs, TensorBoard and summary equal those of
  the same rung whose programs were built afresh."""
  other = _config(**{'optim.lr': 0.01, 'train.seed': 3})
  with monkeypatch.context() as m:
    m.setattr(programs, '_KEPT', collections.OrderedDict())  # as alone in its process
    alone = train_rung(other, str(tmp_path / 'alone'))
  train_rung(_config(), str(tmp_path / 'first'))  # `reference`'s programs, if still kept
  events = []
  record = lambda event, duration, **kw: events.append((event, duration))
  jax.monitoring.register_event_duration_secs_listener(record)
  try:
    after = train_rung(other, str(tmp_path / 'after'))
  finally:
    jax.monitoring.unregister_event_duration_listener(record)
  # a fresh trace would be lowered: no lowering, no fresh trace
  built = [e for e, _ in events if e.endswith(('to_mlir_module_duration', 'compile_duration'))]
  assert not built and any(e.endswith('jaxpr_trace_duration') for e, _ in events), built
  _assert_same_summary(alone, after)
  _assert_same_run(tmp_path / 'alone', tmp_path / 'after')
  assert read_jsonl(tmp_path / 'alone' / 'train_log.jsonl') != read_jsonl(
      tmp_path / 'first' / 'train_log.jsonl')  # the rate and seed changed the run


def _damage(step_dir, kind: str) -> None:
  files = [p for p in glob.glob(os.path.join(step_dir, '**'), recursive=True) if os.path.isfile(p)]
  if kind == 'truncated_files':  # a full disk, a preemption during a non-atomic finalize
    for p in files:
      open(p, 'w').close()
  elif kind == 'missing_shard':  # the largest array data file
    os.remove(max((p for p in files if '/d/' in p), key=os.path.getsize))
  else:
    with open(os.path.join(step_dir, 'state', '_METADATA'), 'w') as f:
      f.write('{"tree_metadata": {"params')


def _abstract_state():
  cfg = _config()
  return abstract(jax.eval_shape(lambda: init_state(make_model(cfg), make_optimizer(cfg), 0,
                                                    cfg.data.seq_len)))


@pytest.mark.parametrize('kind', DAMAGE)
def test_unreadable_latest_checkpoint_is_moved_aside_and_the_previous_restored(
    killed, tmp_path, kind, capfd):
  ckpts = tmp_path / 'checkpoints'
  shutil.copytree(killed / 'checkpoints', ckpts)
  pristine = Checkpointer(str(killed / 'checkpoints'), 2)
  want, want_data = pristine.restore(2, _abstract_state())
  pristine.close()
  _damage(str(ckpts / '4'), kind)
  ckpt = Checkpointer(str(ckpts), 2)
  step, state, data_state = ckpt.restore_latest(_abstract_state())
  ckpt.close()
  assert step == 2 and data_state == want_data
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(want)))
  assert sorted(os.listdir(ckpts)) == ['2', 'corrupt-4-0']
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith('warning:')]
  assert len(warnings) == 1 and 'step 4 is unreadable' in warnings[0], warnings


def test_resume_past_an_unreadable_checkpoint_is_bitwise(reference, killed, tmp_path):
  ref_dir, ref_summary = reference
  shutil.copytree(killed, tmp_path, dirs_exist_ok=True)
  _damage(str(tmp_path / 'checkpoints' / '4'), 'truncated_files')
  _assert_same_summary(ref_summary, train_rung(_config(), str(tmp_path)))
  _assert_same_run(ref_dir, tmp_path)
  assert os.path.isdir(tmp_path / 'checkpoints' / 'corrupt-4-0')


def test_no_readable_checkpoint_fails_in_one_line_and_moves_nothing(killed, tmp_path):
  ckpts = tmp_path / 'checkpoints'
  shutil.copytree(killed / 'checkpoints', ckpts)
  _damage(str(ckpts / '4'), 'truncated_files')
  _damage(str(ckpts / '2'), 'corrupt_metadata')
  ckpt = Checkpointer(str(ckpts), 2)
  with pytest.raises(UnreadableCheckpoints,
                     match=r'no readable checkpoint \(step 4: .*; step 2: ') as e:
    ckpt.restore_latest(_abstract_state())
  ckpt.close()
  assert isinstance(e.value, ConfigError) and '\n' not in str(e.value)
  assert sorted(os.listdir(ckpts)) == ['2', '4']


def _rung_dir(tmp_path, cfg, step: int = 4):
  """A rung directory as a run of cfg leaves it at a checkpoint of `step` (no training)."""
  (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  resume.write_config(cfg, str(tmp_path), {}, 0)
  return str(tmp_path)


def test_resume_refuses_a_config_that_changes_the_function(tmp_path, capfd):
  workdir = _rung_dir(tmp_path, _config())
  before = (tmp_path / 'config.json').read_text()
  for field, value in (('optim.warmup_steps', 3), ('model.num_layers', 4), ('train.seed', 1),
                       ('data.source', 'khop'), ('optim.lr', 1e-3)):
    with pytest.raises(ConfigError, match=rf'^{field} changed since .*allowed only with '
                       '--allow_config_change') as e:
      resume.check_config(_config(**{field: value}), workdir)
    assert '\n' not in str(e.value)
  with pytest.raises(ConfigError,
                     match=r'^model.d_model, optim.b1 changed .*model.d_model 32 -> 64'):
    resume.check_config(_config(**{'model.d_model': 64, 'optim.b1': 0.8}), workdir)
  with pytest.raises(ConfigError, match=r'train.steps=3 is invalid: allowed >= 4'):
    resume.check_config(_config(**{'train.steps': 3}), workdir)
  assert (tmp_path / 'config.json').read_text() == before
  assert sorted(os.listdir(tmp_path)) == ['checkpoints', 'config.json']
  assert capfd.readouterr().err == ''

  forced = resume.check_config(_config(**{'optim.warmup_steps': 3}), workdir, True)
  assert forced == {'optim.warmup_steps': (2, 3)}
  resume.write_config(_config(**{'optim.warmup_steps': 3}), workdir, forced, 4)
  (record,) = read_jsonl(tmp_path / resume.HISTORY)
  assert record['step'] == 4 and record['refused_fields_allowed'] == ['optim.warmup_steps']
  assert json.loads((tmp_path / 'config.json').read_text())['optim']['warmup_steps'] == 3


def test_resume_allows_cadence_and_longer_runs_with_one_warning(tmp_path, capfd):
  workdir = _rung_dir(tmp_path, _config())
  capfd.readouterr()
  new = _config(**{'train.log_every': 3, 'train.eval_every': 5, 'train.checkpoint_every': 1,
                       'metrics.analysis_every': 2, 'train.steps': 12, 'mesh.data': 1})
  changes = resume.check_config(new, workdir)
  assert set(changes) == {'train.log_every', 'train.eval_every', 'train.checkpoint_every',
                          'metrics.analysis_every', 'train.steps', 'mesh.data'}
  (line,) = capfd.readouterr().err.splitlines()
  assert line.startswith('warning:') and 'train.steps 6 -> 12' in line and 'horizon' in line
  assert resume.check_config(_config(), workdir) == {}  # unchanged: silent
  assert capfd.readouterr().err == ''
  assert resume.check_config(new, str(tmp_path / 'fresh')) == {}  # nothing to resume


@pytest.mark.parametrize('source', ['text:{empty}', 'text:{one_line}', 'text:{missing}'])
def test_too_small_corpus_fails_before_anything_is_written(tmp_path, source):
  """An empty file (no train window), two short lines (a train window, no eval window), a
  glob matching nothing."""
  (tmp_path / 'empty.txt').write_text('')
  (tmp_path / 'one_line.txt').write_text('a single short line of text\n' * 2)
  cfg = _config()
  cfg.data.source = source.format(empty=tmp_path / 'empty.txt', one_line=tmp_path / 'one_line.txt',
                                  missing=tmp_path / 'none' / '*.txt')
  with pytest.raises(ConfigError, match=r'^data.source') as e:
    train_rung(cfg, str(tmp_path / 'rung'))
  assert '\n' not in str(e.value) and not (tmp_path / 'rung').exists()


def test_a_corpus_is_measured_in_windows_per_split(tmp_path):
  (tmp_path / 'corpus.txt').write_bytes(bytes(range(32, 127)) * 21)  # 1995 bytes
  cfg = _config(**{'data.source': f'text:{tmp_path / "corpus.txt"}', 'data.seq_len': 32})
  tokens = 1995 + 1  # the byte tokenizer: one token per byte, then EOS
  held = round(tokens * cfg.data.eval_fraction)
  window = cfg.data.seq_len + 1
  assert data.measure(cfg.data) == {'train': (tokens - held) // window, 'eval': held // window}


def test_mesh_larger_than_the_devices_fails_before_anything_is_written(tmp_path):
  with pytest.raises(ConfigError, match=r'^mesh.data=3, .* product is the 1 devices'):
    train_rung(_config(**{'mesh.data': 3}), str(tmp_path / 'rung'))
  assert not (tmp_path / 'rung').exists()


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
  path = tmp_path / 'summary.json'
  storage.write_json(path, {'a': 1})

  def fail(*_):
    raise KeyboardInterrupt
  monkeypatch.setattr(os, 'fsync', fail)
  with pytest.raises(KeyboardInterrupt):
    storage.write_json(path, {'a': 2})
  assert json.loads(path.read_text()) == {'a': 1}
  assert os.listdir(tmp_path) == ['summary.json']  # no temporary file left


def test_jsonl_drops_a_line_torn_by_a_kill(tmp_path):
  path = tmp_path / 'log.jsonl'
  path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x"')
  assert read_jsonl(path) == [{'step': 0, 'x': 1}, {'step': 1, 'x': 2}]
  log = Jsonl(str(path), 5)
  log.write({'step': 2, 'x': 3})
  assert [r['step'] for r in read_jsonl(path)] == [0, 1, 2]
  path.write_text('{"step": 0}\n{"step": 1}')  # complete but unterminated: kept
  Jsonl(str(path), 1).write({'step': 1})
  assert read_jsonl(path) == [{'step': 0}, {'step': 1}]


EXPERIMENT = """
from tests.helpers import tiny_config


def get_config(arg=None):
  return tiny_config(**{'optim.lr': 1e38, 'optim.clip_norm': 0.0, 'optim.warmup_steps': 0,
                        'optim.schedule': 'constant', 'train.steps': 20,
                        'train.checkpoint_every': 100})
"""
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(tmp_path, *args):
  path = tmp_path / 'diverging.py'
  path.write_text(textwrap.dedent(EXPERIMENT))
  return subprocess.run([sys.executable, '-m', 'depthscale.main', f'--config={path}',
                         f'--workdir={tmp_path / "runs"}', *args], capture_output=True, text=True,
                        timeout=600, cwd=ROOT, check=False)


@pytest.mark.slow  # the CLI end to end
def test_cli_non_finite_loss_exits_3_in_one_line(tmp_path):
  res = _cli(tmp_path)
  assert res.returncode == 3, res.stderr[-2000:]
  lines = [l for l in res.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and 'Traceback' not in res.stderr, lines
  assert lines[0].startswith('error: non-finite loss or gradient at step ')
  assert 'no checkpoint was saved before it' in lines[0]


def test_cli_verbose_shows_the_traceback(tmp_path):
  res = _cli(tmp_path, '--config.mesh.data=3', '--verbose')
  assert res.returncode == 2 and 'Traceback' in res.stderr
  assert res.stderr.splitlines()[-1].startswith('error: mesh.data=3')
  assert not (tmp_path / 'runs').exists()
