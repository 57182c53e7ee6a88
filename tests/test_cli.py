"""Command line end to end: a 2-rung ladder, TensorBoard tags, resume/skip, SIGTERM,
one-line config errors (exit 2, nothing written) and a quiet libtpu without a TPU."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale.storage import read_jsonl
from tests.helpers import ROOT
from depthscale.training import host_cuda, host_libtpu, topology

pytestmark = pytest.mark.slow  # subprocesses of the CLI, end to end

TINY = ['--config.model.d_model=32', '--config.model.num_heads=2', '--config.data.seq_len=32',
        '--config.data.batch_size=4', '--config.data.eval_batches=1', '--config.train.steps=4',
        '--config.train.log_every=2', '--config.train.eval_every=2',
        '--config.train.checkpoint_every=2', '--config.optim.warmup_steps=1',
        '--config.metrics.analysis_every=0', '--config.metrics.images=False']

EXPERIMENT = '''
"""Two-rung test ladder."""
from depthscale.config import default_config
from depthscale.ladder import Rung


def get_config(arg=None):
  return default_config()


def get_ladder(arg=None):
  return [Rung('pre', {'model.block': 'pre_ln', 'model.num_layers': 2}),
          Rung('post', {'model.block': 'post_ln', 'model.num_layers': 3})]
'''


def _cli(*args, **kw):
  return subprocess.run([sys.executable, '-m', 'depthscale.main', *args], capture_output=True,
                        text=True, timeout=600, **kw)


@pytest.fixture
def experiment(tmp_path):
  path = tmp_path / 'two_rungs.py'
  path.write_text(textwrap.dedent(EXPERIMENT))
  return str(path)


def test_ladder_end_to_end(tmp_path, experiment):
  workdir = tmp_path / 'runs'
  res = _cli(f'--config={experiment}', f'--workdir={workdir}', *TINY, '--config.train.steps=5')
  assert res.returncode == 0, res.stderr[-2000:]
  assert 'pre' in res.stdout and 'post' in res.stdout and 'eval_loss' in res.stdout
  for rung, depth in (('pre', 2), ('post', 3)):
    d = workdir / rung
    assert {'config.json', 'layer_metrics.jsonl', 'summary.json', 'checkpoints'} <= set(os.listdir(d))
    cfg = json.loads((d / 'config.json').read_text())
    assert cfg['model']['num_layers'] == depth and cfg['train']['steps'] == 5  # CLI applies last
    summary = json.loads((d / 'summary.json').read_text())
    for key in ('final_train_loss', 'final_eval_loss', 'params', 'non_embedding_params', 'tokens',
                'steps', 'compile_s', 'tokens_per_sec'):
      assert key in summary
    assert summary['steps'] == 5 and summary['tokens'] == 5 * 4 * 32
    records = read_jsonl(d / 'layer_metrics.jsonl')
    assert [r['step'] for r in records] == [0, 2, 4]
    assert all(len(r[m]) == depth for r in records for m in ('grad_norm', 'act_var', 'act_rms', 'update_ratio'))
    acc = EventAccumulator(str(d))
    acc.Reload()
    tags = set(acc.Tags()['scalars'])
    expected = {'train/loss', 'eval/loss', 'train/grad_norm', 'train/lr', 'perf/tokens_per_sec',
                'perf/step_ms'} | {f'layers/{m}/{l:04d}' for m in ('grad_norm', 'act_var')
                                   for l in range(1, depth + 1)}
    assert expected <= tags, expected - tags
    assert [e.step for e in acc.Scalars('train/loss')] == [0, 2, 4]
    assert acc.Scalars('layers/grad_norm/0001')[0].value == pytest.approx(records[0]['grad_norm'][0])

  # The same command again: finished rungs are skipped, nothing retrained.
  before = (workdir / 'pre' / 'summary.json').read_text()
  res = _cli(f'--config={experiment}', f'--workdir={workdir}', *TINY, '--config.train.steps=5')
  assert res.returncode == 0 and 'step' not in res.stdout.split('rung')[0]
  assert (workdir / 'pre' / 'summary.json').read_text() == before


def test_single_rung_by_name_and_index(tmp_path, experiment):
  res = _cli(f'--config={experiment}', f'--workdir={tmp_path / "w"}', *TINY, '--rung=1')
  assert res.returncode == 0, res.stderr[-2000:]
  assert os.listdir(tmp_path / 'w') == ['post']


def test_sigterm_saves_and_resume_matches_uninterrupted(tmp_path, experiment):
  args = [f'--config={experiment}', *TINY, '--config.train.steps=200',
          '--config.train.log_every=1', '--config.train.checkpoint_every=1000',
          '--config.train.eval_every=1000', '--rung=pre']
  proc = subprocess.Popen([sys.executable, '-m', 'depthscale.main', f'--workdir={tmp_path / "a"}',
                           *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  log = tmp_path / 'a' / 'pre' / 'train_log.jsonl'
  deadline = time.time() + 300
  while not (log.exists() and len(log.read_text().splitlines()) >= 3) and time.time() < deadline:
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-2000:]
  assert 'SIGTERM' in out
  saved = [d for d in os.listdir(tmp_path / 'a' / 'pre' / 'checkpoints') if d.isdigit()]
  assert saved and not (tmp_path / 'a' / 'pre' / 'summary.json').exists()
  assert _cli(f'--workdir={tmp_path / "a"}', *args).returncode == 0
  assert _cli(f'--workdir={tmp_path / "b"}', *args).returncode == 0
  resumed = read_jsonl(tmp_path / 'a' / 'pre' / 'train_log.jsonl')
  straight = read_jsonl(tmp_path / 'b' / 'pre' / 'train_log.jsonl')
  assert [r['train/loss'] for r in resumed] == [r['train/loss'] for r in straight]


def test_a_sweeps_rungs_share_compiled_programs_in_the_ladder_directory(tmp_path):
  """With no compilation cache set, a ladder's rungs share WORKDIR/.jax_cache (every program
  written, however quick to compile): the second rate of a sweep adds no entry, as its
  programs are the first rate's; --nocompilation_cache writes none, even for the stage-2
  rung's new seed."""
  env = {k: v for k, v in os.environ.items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  workdir = tmp_path / 'w'
  cache = workdir / '.jax_cache'
  args = [f'--config={ROOT}/tests/launch_ladder.py:sweep', f'--workdir={workdir}',
          '--config.train.steps=4']
  entries = []
  for rung, flags in (('v_lr1e-3', []), ('v_lr1e-2', []), ('v_best_s1', ['--nocompilation_cache'])):
    res = _cli(*args, f'--rung={rung}', *flags, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    entries.append(sorted(os.listdir(cache)))
  assert any(e.startswith('jit_step') for e in entries[0])
  assert entries[0] == entries[1] == entries[2]


# libtpu's start-up lines on a host without a TPU when nothing names the host.
LIBTPU_NO_HOST = ('Failed to find host bounds', 'unexpected worker hostname',
                  'could not determine TPU')


# The CUDA plugin's start-up failure on a host without a GPU when its driver check runs.
CUDA_PLUGIN_NO_DRIVER = ('Jax plugin configuration error', 'Unable to load cuPTI')


@pytest.mark.skipif(not topology.has_libtpu() or host_libtpu.has_tpu() or host_cuda.has_gpu(),
                    reason='needs libtpu and a host without a TPU or GPU')
def test_libtpu_and_the_cuda_plugin_start_quietly_without_a_tpu_or_gpu(tmp_path, experiment):
  """A dry run for a TPU slice without $JAX_PLATFORMS starts libtpu for the slice's devices
  and probes this host for TPU and GPU devices (the CUDA plugin of the gpu extra too), as a
  training run does; it prints none of libtpu's lines about a host it cannot find, nor the
  CUDA plugin's about a driver it cannot load."""
  env = {k: v for k, v in os.environ.items() if k not in (
      'JAX_PLATFORMS', 'JAX_SKIP_CUDA_CONSTRAINTS_CHECK', *host_libtpu.ONE_HOST)}
  res = _cli(f'--config={experiment}', '--dry_run', '--topology=v5p-8', *TINY, '--rung=pre',
             env=env)
  assert res.returncode == 0, res.stderr[-2000:]
  assert 'dry run on v5p-8' in res.stdout
  for line in LIBTPU_NO_HOST + CUDA_PLUGIN_NO_DRIVER:
    assert line not in res.stdout + res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize('flag,field', [
    ('--config.model.num_heads=3', 'model.num_heads'),
    ('--config.model.block=foo_ln', 'model.block'),
    ('--config.model.norm=batchnorm', 'model.norm'),
    ('--config.model.num_layers=0', 'model.num_layers'),
    ('--config.model.no_such_field=1', 'no_such_field'),
    ('--config.data.source=nope', 'data.source'),
    ('--config.mesh.data=3', 'mesh.data'),
    ('--rung=nope', '--rung'),
    ('--dry_run_resume', '--dry_run_resume'),  # without --dry_run_json
])
def test_invalid_config_exits_2_with_one_line(tmp_path, experiment, flag, field):
  workdir = tmp_path / 'never'
  res = _cli(f'--config={experiment}', f'--workdir={workdir}', *TINY, flag)
  assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
  lines = [l for l in res.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and field in lines[0], lines
  assert not workdir.exists()


def test_an_unknown_config_flag_names_the_fields_of_its_section(tmp_path, experiment):
  """At parse time: the field and its section's fields (not a KeyError's text), exit 2."""
  workdir = tmp_path / 'never'
  res = _cli(f'--config={experiment}', f'--workdir={workdir}', *TINY,
             '--config.model.nosuchfield=1')
  assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
  line, = [l for l in res.stderr.splitlines() if l.strip()]
  assert line.startswith('error: model.nosuchfield (command line) is not a config field: allowed '
                         'model.FIELD with FIELD in '), line
  assert ' d_model, ' in line and ' num_layers, ' in line
  assert not workdir.exists()


def test_background_failures_print_one_line_each(monkeypatch, capsys):
  """Native threads print a failed callback through sys.unraisablehook: a full disk made
  each of tensorstore's pending save callbacks print a traceback ('Event loop is closed')
  before the run's own one-line error."""
  import _testcapi  # CPython's C-API test module: PyErr_WriteUnraisable, as C code calls it
  import threading

  from depthscale import main
  monkeypatch.setattr(sys, 'unraisablehook', main._callback_failed)
  monkeypatch.setattr(main, '_warned', set())

  def native_callback_fails():
    for _ in range(3):
      try:
        raise RuntimeError('Event loop is closed')
      except RuntimeError as e:
        _testcapi.write_unraisable_exc(e, None, None)

  thread = threading.Thread(target=native_callback_fails)
  thread.start()
  thread.join()
  assert capsys.readouterr().err.splitlines() == [
      'warning: a background callback failed: RuntimeError: Event loop is closed']
