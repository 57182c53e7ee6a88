"""The launcher's parts that need no cluster: the launch config section, rung tasks and
their state on disk, the rung processes' flags and environment, and the one-line refusals
(Ray not installed, an unreachable RAY_ADDRESS) before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from depthscale import config as config_lib
from depthscale import launch, storage
from depthscale.errors import ConfigError
from depthscale.experiment import prepare
from depthscale.launch import __main__ as cli
from depthscale.launch import attempt, cluster, plan, run, runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER = os.path.join(ROOT, 'tests', 'launch_ladder.py')


@pytest.mark.parametrize('field, value', [('cpus', 0), ('hosts', 0), ('gpus', -1),
                                          ('retries', True), ('tpu', 'h100-8'), ('tpu', 'v5p-6')])
def test_launch_fields_are_validated_naming_the_field(field, value):
  c = config_lib.default_config()
  c.launch[field] = value
  with pytest.raises(ConfigError, match=rf'^launch\.{field}='):
    config_lib.validate(c)


def test_a_tpu_slice_runs_its_own_processes():
  c = config_lib.default_config()
  c.launch.tpu = 'v5p-64'
  config_lib.validate(c)
  c.launch.hosts = 2
  with pytest.raises(ConfigError, match='launch.tpu'):
    config_lib.validate(c)


def test_tasks_carry_each_rungs_needs_and_resources(tmp_path):
  resolved = prepare(f'{LADDER}:sweep', str(tmp_path), {'launch.cpus': 2}, check_machine=False)
  tasks = {t.name: t for t in plan.tasks(resolved)}
  assert tasks['v_best_s1'].needs == ('v_lr1e-3', 'v_lr1e-2')
  assert tasks['v_lr1e-3'].needs == ()
  assert {t.cpus for t in tasks.values()} == {2} and tasks['v_lr1e-3'].resources == '2 CPUs'
  gang = plan.Task('x', (), 10, cpus=4, hosts=2, tpu='', gpus=8, retries=3)
  assert gang.resources == '2 hosts x 4 CPUs, 8 GPUs'


def test_rungs_that_run_the_same_programs_start_one_of_each_first(tmp_path, monkeypatch):
  """A task's wave counts the rungs before it that run its compiled programs (differing only
  in optim.lr or train.seed): a sweep's rates and its stage-2 seed are waves 0, 1, 2, rungs
  of two depths both wave 0; the launcher starts ready rungs by wave, then in ladder order."""
  sweep = plan.tasks(prepare(f'{LADDER}:sweep', str(tmp_path), check_machine=False))
  assert [(t.name, t.wave) for t in sweep] == [('v_lr1e-3', 0), ('v_lr1e-2', 1), ('v_best_s1', 2)]
  depths = plan.tasks(prepare(LADDER, str(tmp_path), check_machine=False))
  assert [(t.name, t.wave) for t in depths] == [('L1', 0), ('L2', 0)]
  started = []
  monkeypatch.setattr(runner.Launcher, '_start', lambda self, r: started.append(r.task.name))
  launcher = runner.Launcher.__new__(runner.Launcher)  # no cluster: only the start order
  launcher.stopping = 0
  launcher.rungs = {t.name: runner.RungState(t) for t in (
      plan.Task(n, (), 10, 1, 1, '', 0, 3, wave) for n, wave in (
          ('a_lr1', 0), ('a_lr2', 1), ('a_lr3', 2), ('b_lr1', 0), ('b_lr2', 1)))}
  launcher._start_ready()  # pylint: disable=protected-access
  assert started == ['a_lr1', 'b_lr1', 'a_lr2', 'b_lr2', 'a_lr3']


def test_done_reads_a_rung_directory(tmp_path):
  workdir = str(tmp_path)
  assert plan.done(workdir, 'a', 10) is None
  for rung in 'abc':
    storage.makedirs(storage.join(workdir, rung))
  storage.write_json(storage.join(workdir, 'a', 'summary.json'), {'steps': 5})
  assert plan.done(workdir, 'a', 10) is None  # a longer train.steps trains on
  assert plan.done(workdir, 'a', 5) == plan.done(workdir, 'a') == 'finished'
  storage.write_json(storage.join(workdir, 'b', 'diverged.json'), {'error': 'nan'})
  assert plan.done(workdir, 'b', 10) == 'diverged'
  storage.write_json(storage.join(workdir, 'c', 'lr_extension.json'), {'needed': False})
  assert plan.done(workdir, 'c', 10) == 'not needed'


def test_each_rung_gets_the_command_line_less_rung():
  argv = ['--config=x.py:a', '--rung=3', '--workdir=w', '--rung', 'b', '--config.train.steps=5']
  assert cli.child_argv(argv) == ['--config=x.py:a', '--workdir=w', '--config.train.steps=5']


def test_environment_sizes_the_cpu_pool_and_forwards_jax_and_storage_settings():
  task = plan.Task('x', (), 10, cpus=3, hosts=1, tpu='', gpus=0, retries=3)
  env = attempt.environment(task, {'JAX_PLATFORMS': 'cpu', 'STORAGE_EMULATOR_HOST': 'h',
                                   'HOME': '/home/u', 'XLA_FLAGS': '--a'})
  assert env == {'JAX_PLATFORMS': 'cpu', 'STORAGE_EMULATOR_HOST': 'h', 'XLA_FLAGS': '--a',
                 'PJRT_NPROC': '3'}
  fake = attempt.environment(task, {'XLA_FLAGS': '--xla_force_host_platform_device_count=8'})
  assert 'PJRT_NPROC' not in fake  # host_threads sizes the pool for the fake devices


def _launch(*args: str, env: dict, code: str = '') -> subprocess.CompletedProcess:
  run = (f'import sys, runpy; {code} sys.argv = ["launch", *{list(args)!r}]; '
         'runpy.run_module("depthscale.launch", run_name="__main__")')
  return subprocess.run([sys.executable, '-c', run], cwd=ROOT, text=True, capture_output=True,
                        timeout=300, env={**os.environ, **env})


def test_what_the_rungs_ray_workers_import_needs_no_jax():
  """The functions and actor of a rung's Ray workers (its host task, the monitor, the signal
  and workdir probes) import no JAX: a worker's start is not a second rung start-up."""
  probe = ('import sys, depthscale.launch.host, depthscale.launch.monitor; '
           'print(sorted(m for m in ("jax", "flax", "orbax") if m in sys.modules))')
  res = subprocess.run([sys.executable, '-c', probe], cwd=ROOT, capture_output=True, text=True)
  assert res.returncode == 0 and res.stdout.split() == ['[]'], res.stdout + res.stderr[-2000:]
  assert launch.run_ladder is run.run_ladder  # the package's name for it, loaded on use


@pytest.mark.slow
def test_without_ray_the_command_names_the_extra(tmp_path):
  res = _launch(f'--config={LADDER}', f'--workdir={tmp_path / "w"}', env={},
                code='sys.modules["ray"] = None;')
  assert res.returncode == 2
  assert res.stderr.strip() == cli.NEEDS_RAY
  assert not (tmp_path / 'w').exists()


@pytest.mark.slow
def test_an_unreachable_ray_address_is_refused_in_one_line(tmp_path):
  res = _launch(f'--config={LADDER}', f'--workdir={tmp_path / "w"}',
                env={'RAY_ADDRESS': '127.0.0.1:1'})
  assert res.returncode == 2
  assert res.stderr.strip().splitlines()[-1].startswith("error: RAY_ADDRESS='127.0.0.1:1' is invalid")
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('name', ['v5p-8', 'v5p-64', 'v4-32', 'v5e-16', 'v6e-8', 'v6e-256'])
def test_slice_names_map_to_the_pod_types_ray_infers(name):
  from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology  # pylint: disable=import-outside-toplevel
  version, shape, pod_type = cluster.tpu_pod_type(name)
  assert pod_type == infer_tpu_pod_type_from_topology(shape, f'TPU-{version.upper()}')
