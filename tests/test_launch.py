"""python -m depthscale.launch against a real Ray cluster on 127.0.0.1 (ray.cluster_utils:
a head that runs no rung and two worker nodes of one CPU each): rungs in parallel equal a
sequential run, a lost node costs no rung, bad input fails once in one line, a sweep's stage
2 waits for its stage 1, two hosts equal one process, a bucket workdir, SIGTERM and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from ray.cluster_utils import Cluster

from depthscale import storage
from depthscale.results import notebook
from depthscale.training import resume

pytestmark = pytest.mark.slow  # a Ray cluster and CLI subprocesses, end to end

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(ROOT, 'tests', 'launch_ladder.py')
QUICKSTART = os.path.join(ROOT, 'experiments', 'quickstart.py')
TIMEOUT = 600
ONE_THREAD = {'PJRT_NPROC': '1'}  # what the launcher gives a rung of launch.cpus=1
WORKER_NICENESS = 'RAY_worker_niceness'  # Ray's setting, read from the environment


@pytest.fixture(scope='module')
def cluster():
  """Its workers, and so the rungs, at the suite's priority: Ray runs task workers at nice 15
  by default, below the other test workers' processes (this module took 526 s beside one
  other test worker, 1,277 s beside two, 342 s alone)."""
  with pytest.MonkeyPatch.context() as env:
    env.setenv(WORKER_NICENESS, '0')
    c = Cluster(initialize_head=True, head_node_args={'num_cpus': 0})
    for _ in range(2):
      c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _env(cluster, **extra) -> dict:
  return {**os.environ, 'RAY_ADDRESS': cluster.address, **extra}


def launch(cluster, *args: str, **env) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'depthscale.launch', *args], cwd=ROOT, text=True,
                        capture_output=True, timeout=TIMEOUT, env=_env(cluster, **env))


def start(cluster, *args: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-m', 'depthscale.launch', *args], cwd=ROOT,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=_env(cluster))


def sequential(*args: str, **env) -> None:
  res = subprocess.run([sys.executable, '-m', 'depthscale.main', *args], cwd=ROOT, text=True,
                       capture_output=True, timeout=TIMEOUT, env={**os.environ, **env})
  assert res.returncode == 0, res.stderr[-3000:]


def eval_loss(workdir, rung: str) -> float:
  return storage.read_json(storage.join(str(workdir), rung, 'summary.json'))['final_eval_loss']


def lines(res) -> list[str]:
  return res.stdout.splitlines()


def index(out: list[str], text: str) -> int:
  return next(i for i, line in enumerate(out) if text in line)


def freeze_at_first_checkpoint(proc: subprocess.Popen, workdir) -> psutil.Process:
  """The launched rung's process, stopped (SIGSTOP) once its first checkpoint exists: what
  the test does next happens in the middle of the rung, however loaded the host."""
  rung_dir, deadline = str(workdir / 'L2'), time.monotonic() + TIMEOUT
  while True:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    rung = next((p for p in psutil.process_iter(['cmdline'])
                 if f'--workdir={workdir}' in ' '.join(p.info['cmdline'] or ())
                 and 'depthscale.main' in p.info['cmdline']), None)
    if rung and os.path.isdir(os.path.join(rung_dir, 'checkpoints')) and resume.checkpoint_steps(
        rung_dir):
      rung.suspend()
      assert not os.path.exists(os.path.join(rung_dir, 'summary.json'))
      return rung
    time.sleep(0.02)


def pending(pid: int, signum: int) -> bool:
  """Whether `signum` waits for process `pid` (stopped: it is delivered on SIGCONT)."""
  with open(f'/proc/{pid}/status', encoding='ascii') as f:
    shared = next(line for line in f if line.startswith('ShdPnd:')).split()[1]
  return bool(int(shared, 16) >> (signum - 1) & 1)


@pytest.fixture(scope='module')
def long_reference(tmp_path_factory):
  """The long rung of the launcher ladder, run to its end by depthscale.main."""
  workdir = tmp_path_factory.mktemp('long_reference')
  sequential(f'--config={LADDER}:long', f'--workdir={workdir}', **ONE_THREAD)
  return eval_loss(workdir, 'L2')


def test_quickstart_ladder_through_the_launcher_equals_a_sequential_run(cluster, tmp_path):
  # 8 steps, without the analyses and images (depthscale.main's, tested in test_cli.py)
  short = ['--config.train.steps=8', '--config.train.log_every=4', '--config.optim.warmup_steps=2',
           '--config.train.eval_every=8', '--config.train.checkpoint_every=8',
           '--config.metrics.analysis_every=0', '--config.metrics.images=False']
  sequential(f'--config={QUICKSTART}', f'--workdir={tmp_path / "seq"}', *short, **ONE_THREAD)
  res = launch(cluster, f'--config={QUICKSTART}', f'--workdir={tmp_path / "par"}', *short)
  assert res.returncode == 0, res.stderr[-3000:]
  rungs = ('pre_ln_L2', 'pre_ln_L8', 'post_ln_L2', 'post_ln_L8', 'post_ln_L8_lr1e-2')
  for rung in rungs:
    assert eval_loss(tmp_path / 'par', rung) == eval_loss(tmp_path / 'seq', rung), rung
    assert f'rung {rung}: finished' in res.stdout
    assert os.path.exists(tmp_path / 'par' / rung / 'launch.log')
  assert any('2 running' in line for line in lines(res))  # both workers at once
  assert 'eval_loss' in res.stdout  # the ladder's table


def test_without_ray_address_it_starts_its_own_instance_beside_a_running_cluster(cluster, tmp_path):
  """A cluster already running on this host (the tests') is not joined without RAY_ADDRESS:
  its shutdown would kill the run's actors."""
  env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
  res = subprocess.run([sys.executable, '-m', 'depthscale.launch', f'--config={LADDER}',
                        f'--workdir={tmp_path}', '--rung=L1'], cwd=ROOT, text=True,
                       capture_output=True, timeout=TIMEOUT, env=env)
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'rungs on the Ray cluster started here (1 node;' in res.stdout
  assert 'os.fork()' not in res.stderr  # JAX's warning, about Ray's fork and exec of its daemons
  assert len(cluster.list_all_nodes()) == 3  # the running cluster untouched


def test_a_rung_whose_node_dies_is_retried_elsewhere_and_ends_equal(cluster, tmp_path,
                                                                     long_reference):
  proc = start(cluster, f'--config={LADDER}:long', f'--workdir={tmp_path}')
  rung = freeze_at_first_checkpoint(proc, tmp_path)
  rung_pid = rung.pid
  ancestors = {p.pid for p in rung.parents()}
  node = next(n for n in cluster.worker_nodes
              if n.all_processes['raylet'][0].process.pid in ancestors)
  cluster.remove_node(node)
  deadline = time.monotonic() + 20
  while psutil.pid_exists(rung_pid) and psutil.Process(rung_pid).status() != 'zombie':
    assert time.monotonic() < deadline, 'the rung process outlived its node'
    time.sleep(0.1)
  cluster.add_node(num_cpus=1)  # two workers again for the other tests
  out, err = proc.communicate(timeout=TIMEOUT)
  assert proc.returncode == 0, err[-3000:]
  assert 'L2: retrying (1/3): its node or worker died' in out
  assert eval_loss(tmp_path, 'L2') == long_reference


def test_a_rung_with_bad_input_fails_once_in_one_line(cluster, tmp_path):
  res = launch(cluster, f'--config={LADDER}', f'--workdir={tmp_path}', '--rung=L1',
               '--config.posthoc.init_from=no_such_rung')
  assert res.returncode == 1
  out = lines(res)
  assert sum('L1: queued' in line for line in out) == 1 and 'retrying' not in res.stdout
  failed = out[index(out, 'L1: failed: ')]
  assert 'posthoc.init_from' in failed, failed


@pytest.mark.parametrize('field, value', [('launch.cpus', '0'), ('launch.hosts', '3'),
                                          ('launch.tpu', 'v5p-64'), ('launch.gpus', '1')])
def test_bad_resources_are_refused_in_one_line_before_any_rung_starts(cluster, tmp_path, field,
                                                                       value):
  workdir = tmp_path / 'ladder'
  res = launch(cluster, f'--config={LADDER}', f'--workdir={workdir}', f'--config.{field}={value}')
  assert res.returncode == 2, res.stderr[-2000:]
  last = res.stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: {field}=') and value in last, last
  assert os.listdir(tmp_path) == []  # nothing written, the probe of the workdir included


def test_a_sweeps_stage_2_starts_only_after_its_stage_1(cluster, tmp_path):
  res = launch(cluster, f'--config={LADDER}:sweep', f'--workdir={tmp_path}')
  assert res.returncode == 0, res.stderr[-3000:]
  out = lines(res)
  stage1_done = max(index(out, 'v_lr1e-3: finished'), index(out, 'v_lr1e-2: finished'))
  assert index(out, 'v_best_s1: queued') > stage1_done
  assert index(out, 'v_lr1e-2: running') < index(out, 'v_lr1e-3: finished')  # in parallel
  assert storage.read_json(str(tmp_path / 'v_best_s1' / 'best_lr.json'))['lr'] in (1e-3, 1e-2)


def test_two_hosts_run_as_two_jax_processes_and_equal_one(cluster, tmp_path):
  two_devices = os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=2'
  sequential(f'--config={LADDER}', f'--workdir={tmp_path / "one"}', '--rung=L2',
             XLA_FLAGS=two_devices.strip())
  res = launch(cluster, f'--config={LADDER}', f'--workdir={tmp_path / "two"}', '--rung=L2',
               '--config.launch.hosts=2')
  assert res.returncode == 0, res.stderr[-3000:]
  log = (tmp_path / 'two' / 'L2' / 'launch.log').read_text()
  assert '[host 0] L2 eval at step 20' in log and '[host 1] L2 eval at step 20' in log
  assert eval_loss(tmp_path / 'two', 'L2') == pytest.approx(eval_loss(tmp_path / 'one', 'L2'),
                                                            rel=1e-6)


def test_a_bucket_workdir_through_the_launcher(cluster, gcs, tmp_path):
  bucket = gcs.bucket()
  sequential(f'--config={LADDER}', f'--workdir={tmp_path}', '--rung=L1', **ONE_THREAD)
  res = launch(cluster, f'--config={LADDER}', f'--workdir=gs://{bucket}/ladder', '--rung=L1')
  assert res.returncode == 0, res.stderr[-3000:]
  assert eval_loss(f'gs://{bucket}/ladder', 'L1') == eval_loss(tmp_path, 'L1')
  assert b'L1: finished' in gcs.get(bucket, 'ladder/L1/launch.log')


def test_sigterm_stops_the_rungs_checkpointed_and_the_same_command_resumes(cluster, tmp_path,
                                                                            long_reference):
  args = (f'--config={LADDER}:long', f'--workdir={tmp_path}')
  proc = start(cluster, *args)
  rung = freeze_at_first_checkpoint(proc, tmp_path)
  proc.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + 60
  while not pending(rung.pid, signal.SIGTERM):
    assert time.monotonic() < deadline, "the launcher's SIGTERM did not reach the rung in 60 s"
    time.sleep(0.05)
  rung.resume()
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 1, err[-3000:]
  assert 'L2: stopped, latest checkpoint at step' in out
  assert not (tmp_path / 'L2' / 'summary.json').exists()
  res = launch(cluster, *args)
  assert res.returncode == 0, res.stderr[-3000:]
  assert eval_loss(tmp_path, 'L2') == long_reference
  res = launch(cluster, *args)  # finished: skipped
  assert 'L2: finished before this launch' in res.stdout and 'queued' not in res.stdout


def test_a_notebook_runs_its_ladder_through_the_launcher(cluster, tmp_path, monkeypatch):
  monkeypatch.setenv('RAY_ADDRESS', cluster.address)
  monkeypatch.setenv(notebook.LAUNCH_ENV, '1')
  rows, res, _ = notebook.run(LADDER, str(tmp_path))
  assert [r['rung'] for r in rows] == ['L1', 'L2']
  assert len(res.summaries) == 2 and (tmp_path / 'L2' / 'launch.log').exists()


def test_a_tpu_rung_takes_a_whole_slice_one_process_per_host(cluster, tmp_path, monkeypatch):
  """A fake v5p-16 slice (2 hosts of 4 chips and a CPU, labelled as Ray labels TPU VMs, worker 0
  with the slice's head resource): Ray's own slice reservation places one process on each of
  its hosts. On the CPU `--multi_host` finds no TPU pod, so the rung fails (retries off)."""
  monkeypatch.setenv('TPU_NAME', 'slice-a')  # how Ray finds a node's slice name (GKE)
  nodes = [cluster.add_node(num_cpus=1, resources={'TPU': 4, **({'TPU-v5p-16-head': 1} if i == 0 else {})},
                            labels={'ray.io/tpu-slice-name': 'slice-a', 'ray.io/tpu-worker-id': str(i),
                                    'ray.io/tpu-pod-type': 'v5p-16'}) for i in range(2)]
  monkeypatch.delenv('TPU_NAME')
  cluster.wait_for_nodes()
  try:
    res = launch(cluster, f'--config={LADDER}', f'--workdir={tmp_path}', '--rung=L1',
                 '--config.launch.tpu=v5p-16', '--config.launch.retries=0')
  finally:
    for node in nodes:
      cluster.remove_node(node)
  assert res.returncode == 1
  assert 'L1: queued (TPU v5p-16)' in res.stdout and 'L1: failed: ' in res.stdout
  log = (tmp_path / 'L1' / 'launch.log').read_text()
  assert '[host 0] ' in log and '[host 1] ' in log and '[host 2] ' not in log
