"""A run whose home is a bucket, against a real GCS-compatible server on 127.0.0.1 (the `gcs`
fixture): the quickstart rung as with a local workdir, SIGTERM, kill -9 and a truncated
checkpoint in the bucket, the readers (results.load, compare, TensorBoard's), one-line
errors for bad bucket input, and failed saves (lost bucket, full disk) that end the run."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale import results, storage
from tests.gcs import GcsServer
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # subprocesses of the CLI, end to end

RUNG = 'pre_ln_L2'
QUICKSTART = [f'--config={ROOT}/experiments/quickstart.py', '--rung=0']
EVERY_25 = ['--config.train.checkpoint_every=25']  # a cadence field: the losses stay the same
LOGS = ('train_log.jsonl', 'eval_log.jsonl', 'layer_metrics.jsonl', 'analysis_log.jsonl')
RUN_TIMEOUT = 600
FAILED_SAVE_EXIT_S = 120  # a lost bucket: gcsfs gives up after its retries (about 30 s)


def _cli(*args: str, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'depthscale.main', *args], capture_output=True,
                        text=True, timeout=RUN_TIMEOUT, cwd=cwd, env=env)


def _start(*args: str, env: dict | None = None) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-m', 'depthscale.main', *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _logs(rung_dir: str) -> dict[str, list[dict]]:
  """The rung's JSONL logs, timings left out."""
  return {f: [{k: v for k, v in r.items() if not k.startswith('perf/')}
              for r in storage.read_jsonl(storage.join(rung_dir, f))] for f in LOGS}


def _losses(rung_dir: str) -> tuple[float, float]:
  s = storage.read_json(storage.join(rung_dir, 'summary.json'))
  return s['final_train_loss'], s['final_eval_loss']


def _complete_steps(server: GcsServer, bucket: str, prefix: str) -> list[int]:
  """Checkpoint steps whose commit marker the server holds, listed by the server."""
  names = server.objects(bucket, f'{prefix}/checkpoints/')
  return sorted(int(n.split('/')[-2]) for n in names
                if n.endswith('/commit_success.txt') and n.split('/')[-2].isdigit()
                and n.count('/') == prefix.count('/') + 3)


def _wait_for(proc: subprocess.Popen, condition, what: str) -> None:
  deadline = time.monotonic() + RUN_TIMEOUT
  while not condition():
    assert proc.poll() is None, f'the run ended before {what}: {proc.communicate()[1][-3000:]}'
    assert time.monotonic() < deadline, f'no {what} within {RUN_TIMEOUT} s'
    time.sleep(0.1)


@pytest.fixture(scope='module')
def local_rung(tmp_path_factory):
  """The quickstart rung with a local workdir: the reference of every bucket run here."""
  workdir = tmp_path_factory.mktemp('local')
  res = _cli(*QUICKSTART, f'--workdir={workdir}')
  assert res.returncode == 0, res.stderr[-3000:]
  return str(workdir / RUNG)


def test_quickstart_rung_in_a_bucket_matches_a_local_workdir_and_reads_back(
    gcs, local_rung, tmp_path):
  bucket = gcs.bucket()
  ladder = f'gs://{bucket}/runs/quickstart'
  res = _cli(*QUICKSTART, f'--workdir={ladder}', cwd=tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  assert os.listdir(tmp_path) == []  # nothing local (once a ./gs:/ directory)
  rung = f'{ladder}/{RUNG}'
  assert _logs(rung) == _logs(local_rung)
  assert _losses(rung) == _losses(local_rung)
  names = gcs.objects(bucket, f'runs/quickstart/{RUNG}/')
  for f in ('config.json', 'data_info.json', 'summary.json', 'checkpoints/150/commit_success.txt'):
    assert f'runs/quickstart/{RUNG}/{f}' in names, f

  bucket_res, local_res = results.load(ladder), results.load(os.path.dirname(local_rung))
  assert bucket_res.layers.equals(local_res.layers)
  assert bucket_res.summaries.final_eval_loss.tolist() == local_res.summaries.final_eval_loss.tolist()

  out = f'gs://{bucket}/compare'
  res = subprocess.run([sys.executable, '-m', 'depthscale.compare', ladder, f'--out={out}'],
                       capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=ROOT)
  assert res.returncode == 0, res.stderr[-3000:]
  assert RUNG in res.stdout and f'wrote {out}/profiles.png' in res.stdout
  written = gcs.objects(bucket, 'compare/')
  (events,) = [name for name in written if 'tfevents' in name]
  assert set(written) == {f'compare/{f}.png' for f in (
      'loss_vs_depth', 'profiles', 'loss_vs_params_fit', 'loss_vs_depth_fit', 'loss_vs_flops')
  } | {events}
  assert all(size > 1000 for size in written.values())
  assert f'wrote gs://{bucket}/{events}' in res.stdout

  acc = {}
  for name, logdir in (('bucket', rung), ('local', local_rung), ('compare', out)):
    acc[name] = EventAccumulator(logdir, size_guidance={'scalars': 0, 'images': 0})
    acc[name].Reload()
  assert [e.encoded_image_string for e in acc['compare'].Images('ladder/profiles')] == [
      gcs.get(bucket, 'compare/profiles.png')]
  assert acc['bucket'].Tags()['scalars'] == acc['local'].Tags()['scalars']
  assert acc['bucket'].Tags()['images'] == acc['local'].Tags()['images'] != []
  assert ([(e.step, e.value) for e in acc['bucket'].Scalars('eval/loss')]
          == [(e.step, e.value) for e in acc['local'].Scalars('eval/loss')])


def test_sigterm_kill_and_a_truncated_checkpoint_in_the_bucket_resume_bitwise(gcs, local_rung):
  bucket = gcs.bucket()
  prefix = 'runs/q'
  workdir = [f'--workdir=gs://{bucket}/{prefix}', *QUICKSTART, *EVERY_25]
  steps = lambda: _complete_steps(gcs, bucket, f'{prefix}/{RUNG}')

  proc = _start(*workdir)  # SIGTERM once a checkpoint is in the bucket: saves, exits 0
  _wait_for(proc, lambda: steps(), 'a checkpoint')
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=RUN_TIMEOUT)
  assert proc.returncode == 0, err[-3000:]
  assert 'SIGTERM: checkpoint saved at step' in out
  saved = steps()[-1]
  assert saved < 150

  proc = _start(*workdir)  # kill -9 after a newer checkpoint
  _wait_for(proc, lambda: steps()[-1] > saved, f'a checkpoint after step {saved}')
  proc.kill()
  proc.communicate()
  latest = steps()[-1]
  state = gcs.objects(bucket, f'{prefix}/{RUNG}/checkpoints/{latest}/state/')
  largest = max(state, key=state.get)
  gcs.put(bucket, largest, gcs.get(bucket, largest)[:state[largest] // 2])

  res = _cli(*workdir)
  assert res.returncode == 0, res.stderr[-3000:]
  assert f'checkpoint at step {latest} is unreadable' in res.stderr
  rung = f'gs://{bucket}/{prefix}/{RUNG}'
  assert _logs(rung) == _logs(local_rung)
  assert _losses(rung) == _losses(local_rung)
  assert any(n.startswith(f'{prefix}/{RUNG}/checkpoints/corrupt-{latest}-0/')
             for n in gcs.objects(bucket, f'{prefix}/{RUNG}/checkpoints/'))


def _no_credentials_env(tmp_path) -> dict:
  """No emulator, no key file, no gcloud config, no GCE metadata server (checked by
  google-auth without a request)."""
  env = {k: v for k, v in os.environ.items() if k not in (
      'STORAGE_EMULATOR_HOST', 'GOOGLE_APPLICATION_CREDENTIALS', 'GOOGLE_AUTH_TOKEN_FOR_TESTING')}
  return {**env, 'HOME': str(tmp_path), 'CLOUDSDK_CONFIG': str(tmp_path / 'gcloud'),
          'NO_GCE_CHECK': 'true', 'GCE_METADATA_HOST': '127.0.0.1:9'}


@pytest.mark.parametrize('case', ['no_bucket', 'no_credentials', 'no_gcsfs'])
def test_bad_bucket_input_fails_in_one_line_before_anything(gcs, tmp_path, case):
  bucket = gcs.bucket()
  url = f'gs://{bucket if case != "no_bucket" else bucket + "-missing"}/runs/q'
  args = [*QUICKSTART, f'--workdir={url}']
  if case == 'no_gcsfs':  # the interpreter of a machine without the gcs extra
    cmd = [sys.executable, '-c', 'import runpy, sys; sys.modules["gcsfs"] = None; '
           f'sys.argv = ["depthscale.main", *{args!r}]; '
           'runpy.run_module("depthscale.main", run_name="__main__")']
  else:
    cmd = [sys.executable, '-m', 'depthscale.main', *args]
  env = _no_credentials_env(tmp_path) if case == 'no_credentials' else None
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=tmp_path,
                       env=env)
  assert res.returncode == 2, res.stderr[-3000:]
  (line,) = res.stderr.strip().splitlines()
  assert line.startswith(f"error: --workdir='{url}'")
  assert {'no_bucket': f'bucket gs://{bucket}-missing does not exist',
          'no_credentials': 'no Google Cloud credentials found: run `gcloud auth',
          'no_gcsfs': 'needs the gcsfs package for gs:// paths: pip install "depthscale[gcs]"',
          }[case] in line
  assert res.stdout == '' and gcs.objects(bucket) == {}
  assert [p for p in os.listdir(tmp_path) if not p.startswith('.')] == []  # nothing written


# orbax's logs are silenced and a background thread's or native callback's failure prints
# one line once (an asyncio callback racing the failure in orbax's threads, 'Event loop is
# closed', printed a traceback per pending save before); a failed save once printed 886
# lines of tracebacks and no line of its own.
MAX_FAILURE_LINES = 5


def _one_line_report(err: str) -> None:
  lines = err.strip().splitlines()
  assert lines[-1].startswith('error: '), err[-3000:]
  assert sum(l.startswith('error: ') for l in lines) == 1, err[-3000:]
  assert 'Traceback' not in err and len(lines) <= MAX_FAILURE_LINES, err[-3000:]


def test_a_lost_bucket_ends_the_run_in_one_line_and_a_rerun_resumes(tmp_path, local_rung):
  server = GcsServer(str(tmp_path / 'objects')).start()  # this test's own server: it stops
  try:
    env = {**os.environ, **server.env}
    bucket = server.bucket()
    workdir = [f'--workdir=gs://{bucket}/runs/q', *QUICKSTART, *EVERY_25]
    proc = _start(*workdir, env=env)
    _wait_for(proc, lambda: _complete_steps(server, bucket, f'runs/q/{RUNG}'), 'a checkpoint')
    server.stop()
    stopped = time.monotonic()
    _, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 5, err[-3000:]
    assert time.monotonic() - stopped < FAILED_SAVE_EXIT_S
    _one_line_report(err)
    assert 'could not be' in err and 'Cannot connect to host 127.0.0.1' in err

    server.start()  # the same objects: the last complete checkpoint resumes
    res = _cli(*workdir, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    for f in LOGS:  # read through this server (this process's clients use the session's)
      (tmp_path / f).write_bytes(server.get(bucket, f'runs/q/{RUNG}/{f}'))
    assert _logs(str(tmp_path)) == _logs(local_rung)
  finally:
    server.stop()


@contextlib.contextmanager
def _tmpfs(path, size: str):
  os.makedirs(path)
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)],
                           capture_output=True)
  if mounted.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {mounted.stderr.decode().strip()}')
  try:
    yield path
  finally:
    subprocess.run(['umount', str(path)], check=True)


def test_a_full_disk_ends_the_run_in_one_line_and_a_rerun_resumes(tmp_path, local_rung):
  with _tmpfs(tmp_path / 'disk', '64m') as disk:
    workdir = disk / 'runs'
    args = [f'--workdir={workdir}', *QUICKSTART, *EVERY_25]
    ckpts = workdir / RUNG / 'checkpoints'
    proc = _start(*args)
    _wait_for(proc, lambda: any(n.isdigit() for n in storage.listdir(ckpts)), 'a checkpoint')
    filler = disk / 'filler'
    with open(filler, 'wb', buffering=0) as f, contextlib.suppress(OSError):
      while True:  # the disk fills up mid-run
        f.write(b'\0' * (1 << 20))
    _, err = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 5, err[-3000:]
    _one_line_report(err)
    assert 'No space left on device' in err or 'RESOURCE_EXHAUSTED' in err, err

    filler.unlink()
    res = _cli(*args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _logs(str(workdir / RUNG)) == _logs(local_rung)
