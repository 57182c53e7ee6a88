"""A store that stops answering: a real TCP proxy (tests/stall_proxy.py) between a run's
clients and the GCS-compatible server stalls, in turn, the bucket check, a log upload, a
checkpoint write and a checkpoint read. Each run ends within the storage deadline (exit 5,
one line naming the file, the phase, the cause and the last complete checkpoint) or its
retry succeeds; a SIGTERM during a stall ends the run within 30 s; the rerun resumes equal
to an uninterrupted run and nothing written before the stall is lost. Also: the deadline's
variable is checked, and SIGTERM ends a process whose main thread is blocked in native code."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from depthscale import storage
from depthscale.errors import ConfigError, StoreTimeout
from depthscale.training import preemption
from tests.gcs import GcsServer
from tests.helpers import ROOT
from tests.stall_proxy import StallProxy
from tests.test_bucket import LOGS, _logs, _losses, _one_line_report

DEADLINE_S = 8  # DEPTHSCALE_STORAGE_DEADLINE of these runs: attempts of 1.6 s
SLACK_S = 10  # from the deadline to the exit: the wait began after the stall, the exit itself
RUN_TIMEOUT = 600
RUNG = 'default'
EXPERIMENT = """
from tests.helpers import tiny_config


def get_config(arg=None):
  return tiny_config(**{'train.steps': 8, 'train.checkpoint_every': 4, 'train.eval_every': 4,
                        'train.log_every': 1})
"""
# Request lines (tests/stall_proxy.py) of each stalled phase: gcsfs uploads a log in two
# requests (a resumable upload: its start, then its bytes with `upload_id`); tensorstore
# writes and reads a checkpoint's arrays (URL-encoded names).
BUCKET_CHECK = r'^GET /storage/v1/b/{bucket}$'
LOG_UPLOAD = rf'^POST /upload/\S*name=runs/q/{RUNG}/train_log\.jsonl&upload_id='
CHECKPOINT_WRITE = (rf'^POST /upload/\S*uploadType=media&name=runs%2Fq%2F{RUNG}%2Fcheckpoints'
                    r'%2F{step}%2F')
CHECKPOINT_READ = (rf'^GET /storage/v1/\S*%2F{RUNG}%2Fcheckpoints%2F{{step}}%2Fstate%2F\S*'
                   r'(manifest\.ocdbt|%2Fd%2F)\S*alt=media')


def _cli(args: list[str], env: dict | None = None, start: bool = False):
  cmd = [sys.executable, '-m', 'depthscale.main', *args]
  if start:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=RUN_TIMEOUT)


def _one_line(err: str) -> str:
  """The run's one error line (tests/test_bucket.py's checks of a one-line report)."""
  _one_line_report(err)
  return err.strip().splitlines()[-1]


@pytest.fixture(scope='module')
def experiment(tmp_path_factory):
  path = tmp_path_factory.mktemp('experiment') / 'tiny.py'
  path.write_text(textwrap.dedent(EXPERIMENT))
  return str(path)


@pytest.fixture(scope='module')
def reference(tmp_path_factory, experiment):
  """The rung run uninterrupted, with a local workdir."""
  workdir = tmp_path_factory.mktemp('reference')
  res = _cli([f'--config={experiment}', f'--workdir={workdir}'])
  assert res.returncode == 0, res.stderr[-3000:]
  return str(workdir / RUNG)


@pytest.mark.slow  # subprocesses of the CLI, end to end
def test_each_stall_ends_the_run_within_the_deadline_and_the_rerun_resumes_equal(
    tmp_path, experiment, reference):
  server = GcsServer(str(tmp_path / 'objects')).start()
  proxy = StallProxy(server.port)
  try:
    bucket = server.bucket()
    env = {**os.environ, **proxy.env(server.env), storage.DEADLINE_ENV: str(DEADLINE_S)}
    args = [f'--config={experiment}', f'--workdir=gs://{bucket}/runs/q']
    prefix = f'runs/q/{RUNG}/'

    def run_stalled(pattern: str, skip: int = 0) -> str:
      """A run whose requests matching pattern (after `skip` of them) all stall: it ends
      with exit 5 within the deadline of the first stall; its error line."""
      proxy.clear()
      proxy.stall_requests(pattern, skip=skip)
      stalls = len(proxy.stalled)
      res = _cli(args, env)
      ended = time.monotonic()
      assert res.returncode == 5, res.stderr[-3000:]
      assert len(proxy.stalled) > stalls, f'nothing stalled: {res.stderr[-3000:]}'
      assert ended - proxy.stalled_at[stalls] < DEADLINE_S + SLACK_S
      return _one_line(res.stderr)

    def checkpoint_objects(step: int) -> dict[str, int]:
      return server.objects(bucket, f'{prefix}checkpoints/{step}/')

    # The bucket check: nothing is written.
    line = run_stalled(BUCKET_CHECK.format(bucket=bucket))
    assert line.startswith(f"error: --workdir='gs://{bucket}/runs/q': bucket check: "
                           f'gs://{bucket} could not be looked up: the store did not answer '
                           f'within {DEADLINE_S} s ({storage.DEADLINE_ENV}); nothing was written')
    assert server.objects(bucket) == {}

    # A log upload at the final flush (the second of train_log.jsonl): checkpoint 4 stays.
    line = run_stalled(LOG_UPLOAD, skip=1)
    assert line.startswith(f'error: logs at step 8: gs://{bucket}/{prefix}train_log.jsonl '
                           'could not be written: the store did not answer'), line
    assert line.endswith(f'the last complete checkpoint is step 4 in gs://{bucket}/{prefix}'
                         'checkpoints: rerun to resume from it'), line
    checkpoint_4 = checkpoint_objects(4)
    assert f'{prefix}checkpoints/4/commit_success.txt' in checkpoint_4
    logged = server.get(bucket, f'{prefix}train_log.jsonl')  # the flush before checkpoint 4
    assert [json.loads(l)['step'] for l in logged.decode().splitlines()] == [0, 1, 2, 3]

    # The write of checkpoint 8 (tensorstore's uploads).
    line = run_stalled(CHECKPOINT_WRITE.format(step=8))
    assert line == (f'error: checkpoint at step 8 could not be saved in gs://{bucket}/{prefix}'
                    f'checkpoints: the store did not answer within {DEADLINE_S} s '
                    f'({storage.DEADLINE_ENV}); the last complete checkpoint is step 4 in '
                    f'gs://{bucket}/{prefix}checkpoints: rerun to resume from it'), line

    # The read of checkpoint 4 on resume: unreadable in time is not damaged, nothing moves.
    line = run_stalled(CHECKPOINT_READ.format(step=4))
    assert line.startswith(f'error: checkpoint gs://{bucket}/{prefix}checkpoints could not be '
                           'read at step 4: the store did not answer'), line
    assert 'nothing was moved' in line
    assert checkpoint_objects(4) == checkpoint_4
    assert not any('corrupt-' in n for n in server.objects(bucket, f'{prefix}checkpoints/'))

    # SIGTERM while the final log upload stalls, with a deadline far away: the run ends
    # within 30 s of it, naming the last complete checkpoint.
    proxy.clear()
    proxy.stall_requests(LOG_UPLOAD, skip=1)
    stalls = len(proxy.stalled)
    proc = _cli(args, {**env, storage.DEADLINE_ENV: '600'}, start=True)
    deadline = time.monotonic() + RUN_TIMEOUT
    while len(proxy.stalled) == stalls:
      assert proc.poll() is None, proc.communicate()[1][-3000:]
      assert time.monotonic() < deadline
      time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert time.monotonic() - sent < 30
    assert proc.returncode == preemption.EXIT_CODE, err[-3000:]
    line = _one_line(err)
    assert line == (f'error: {RUNG} SIGTERM: the run did not end within '
                    f'{preemption.GRACE_S:g} s of it; the last complete checkpoint is step 4 '
                    f'in gs://{bucket}/{prefix}checkpoints: rerun to resume from it'), line

    # The rerun: one stall of a log upload and one of a checkpoint write, each retried.
    proxy.clear()
    proxy.stall_requests(LOG_UPLOAD, times=1)
    proxy.stall_requests(CHECKPOINT_WRITE.format(step=8), times=1)
    stalls = len(proxy.stalled)
    res = _cli(args, env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(proxy.stalled) == stalls + 2, proxy.stalled[stalls:]
    local = tmp_path / 'rung'
    local.mkdir()
    for f in (*LOGS, 'summary.json'):  # read through the server, not the proxy
      (local / f).write_bytes(server.get(bucket, prefix + f))
    assert _logs(str(local)) == _logs(reference)
    assert _losses(str(local)) == _losses(reference)
  finally:
    proxy.close()
    server.stop()


@pytest.mark.parametrize('value', ['soon', '0', '-3', 'inf', 'nan'])
def test_a_bad_deadline_is_refused_in_one_line(monkeypatch, value):
  monkeypatch.setenv(storage.DEADLINE_ENV, value)
  with pytest.raises(ConfigError, match=rf'^{storage.DEADLINE_ENV}={value!r} is invalid: '
                     'allowed a number of seconds > 0$'):
    storage.deadline()


def test_the_deadline_is_read_from_the_environment(monkeypatch):
  monkeypatch.delenv(storage.DEADLINE_ENV, raising=False)
  assert storage.deadline() == storage.DEFAULT_DEADLINE_S
  monkeypatch.setenv(storage.DEADLINE_ENV, '12.5')
  assert storage.deadline() == 12.5


def test_storage_through_each_mode_of_the_proxy(gcs, monkeypatch):
  """This process's own bucket reads, through the proxy: answered when passed or delayed;
  StoreTimeout within the deadline when stalled or dropped; then answered again, unchanged."""
  proxy = StallProxy(gcs.port)
  try:
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', proxy.url)  # gcsfs reads it per request
    path = f'gs://{gcs.bucket()}/x.json'
    storage.write_json(path, {'a': 1})
    proxy.set('delay', 0.2)
    assert storage.read_json(path) == {'a': 1}
    monkeypatch.setenv(storage.DEADLINE_ENV, '3')
    for mode in ('stall', 'drop'):
      proxy.set(mode)
      start = time.monotonic()
      with pytest.raises(StoreTimeout, match=rf'^{path} could not be read: the store did not '
                         rf'answer within 3 s \({storage.DEADLINE_ENV}\)$'):
        storage.read_json(path)
      assert time.monotonic() - start < 4, mode
    proxy.clear()
    assert storage.read_json(path) == {'a': 1}
    assert {'GET', 'POST'} <= {line.split()[0] for line in proxy.requests}
  finally:
    proxy.close()


BLOCKED_MAIN_THREAD = """
import ctypes, signal
from depthscale.training import preemption
preemption.GRACE_S = 1.0
with preemption.Preemption('r', lambda: 'the last complete checkpoint is step 4'):
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # another thread receives it
  print('ready', flush=True)
  ctypes.CDLL(None).sleep(60)  # native code: no Python handler runs on this thread
"""


def test_sigterm_ends_a_process_whose_main_thread_is_blocked_in_native_code():
  proc = subprocess.Popen([sys.executable, '-c', BLOCKED_MAIN_THREAD], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  assert proc.stdout.readline() == 'ready\n'
  proc.send_signal(signal.SIGTERM)
  sent = time.monotonic()
  _, err = proc.communicate(timeout=30)
  assert proc.returncode == preemption.EXIT_CODE and time.monotonic() - sent < 10, err
  assert err == ('error: r SIGTERM: the run did not end within 1 s of it; the last complete '
                 'checkpoint is step 4\n')
