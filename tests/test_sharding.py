"""Sharded training on fake CPU devices: every mesh matches one device, parameters and
optimizer state sit where the rules say, checkpoints move across meshes, two processes agree.

The JAX work runs in subprocesses (tests/sharding_worker.py) that see 8 (or 2 x 2) fake
devices; this module's own JAX keeps its single device.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from depthscale.config import ConfigError, default_config
from depthscale.training import distributed, sharding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Loaded 2-core CI machines can starve a device thread past XLA's 40 s rendezvous limit.
SLOW_RENDEZVOUS = ('--xla_cpu_collective_call_terminate_timeout_seconds=600 '
                   '--xla_cpu_collective_call_warn_stuck_timeout_seconds=120')
RTOL = 1e-5


def _env(devices: int) -> dict:
  return {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu',
          'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices} {SLOW_RENDEZVOUS}'}


def _result(proc_out: str) -> dict:
  lines = [l for l in proc_out.splitlines() if l.startswith('RESULT ')]
  assert lines, proc_out[-3000:]
  return json.loads(lines[-1][len('RESULT '):])


@pytest.fixture(scope='module')
def cases(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('sharding')
  proc = subprocess.run([sys.executable, '-m', 'tests.sharding_worker', 'cases', str(workdir)],
                        env=_env(8), cwd=ROOT, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return _result(proc.stdout)


def _assert_same_run(run: dict, ref: dict, steps=slice(None)) -> None:
  np.testing.assert_allclose(run['loss'][steps], ref['loss'][steps], rtol=RTOL)
  for got, want in zip(run['layers'][steps], ref['layers'][steps]):
    assert sorted(got) == sorted(want)
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=1e-7, err_msg=k)


@pytest.mark.parametrize('mesh', ['8x1x1', '2x4x1', '2x2x2', '1x4x2'])
def test_mesh_matches_single_device(cases, mesh):
  assert cases['devices'] == 8
  assert len(cases[mesh]['loss']) == 10
  _assert_same_run(cases[mesh], cases['reference'])


def test_params_and_optimizer_state_sharded_as_rules_say(cases):
  # mesh (data 1, fsdp 4, tensor 2); rules: embed->fsdp, mlp/heads/vocab->tensor, layers never
  expected = {  # path: (partition, first shard's shape)
      "['blocks']['mlp']['wi']": ([None, 'fsdp', 'tensor'], [3, 8, 64]),
      "['blocks']['mlp']['wo']": ([None, 'tensor', 'fsdp'], [3, 64, 8]),
      "['blocks']['attn']['q']": ([None, 'fsdp', 'tensor', None], [3, 8, 1, 16]),
      "['blocks']['attn']['o']": ([None, 'tensor', None, 'fsdp'], [3, 1, 16, 8]),
      "['blocks']['attn_norm']['scale']": ([None, 'fsdp'], [3, 8]),
      "['embedding']": (['tensor', 'fsdp'], [128, 8]),
  }
  params, opt = cases['params'], cases['opt_state']
  for path, want in expected.items():
    assert params[path] == list(want), path
    moments = [v for k, v in opt.items() if k.endswith(path) and v[1] != []]
    assert len(moments) == 2 and all(m == list(want) for m in moments), (path, moments)
  assert all(spec[0] is None for path, (spec, _) in params.items() if 'blocks' in path)


def test_replication_check_and_layer_rule_fire(cases):
  assert 'replicated on mesh' in cases['replicated_error']
  assert 'mesh.max_replicated_size' in cases['replicated_error']
  assert cases['layers_error'].startswith("mesh.rules.layers='fsdp' is invalid")


def test_checkpoint_from_2x4x1_resumes_on_8x1x1(cases):
  assert cases['stopped'] == {'status': 'stopped', 'step': 5}
  _assert_same_run(cases['resumed'], cases['reference'])


def test_dry_run_reports_memory_and_shardings(cases):
  report = cases['dry_run']
  assert report['mesh'] == {'data': 1, 'fsdp': 4, 'tensor': 2}
  assert report['params'] == 3 * (4 * 32 * 32 + 2 * 32 * 128 + 4 * 32) + 256 * 32 + 2 * 32
  assert report['peak_bytes_per_device'] > report['steps']['plain']['memory']['argument'] > 0
  assert any(l.split()[0] == 'blocks/mlp/wi' and "(None, 'fsdp', 'tensor')" in l
             for l in report['lines'])


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def test_two_processes_agree_on_the_loss(cases, tmp_path):
  address = f'127.0.0.1:{_free_port()}'
  procs = [subprocess.Popen([sys.executable, '-m', 'tests.sharding_worker', 'process',
                             str(tmp_path), address, '2', str(i)], env=_env(2), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=900)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  results = [_result(out) for out in outs]
  assert [r['process_index'] for r in results] == [0, 1]
  assert all(r['process_count'] == 2 and r['devices'] == 4 for r in results)
  assert results[0]['final_train_loss'] == results[1]['final_train_loss']
  logged = [json.loads(l)['train/loss'] for l in (tmp_path / 'train_log.jsonl').read_text().splitlines()]
  np.testing.assert_allclose(logged, cases['reference']['loss'], rtol=RTOL)


def test_mesh_sizes_resolve_and_reject():
  m = default_config().mesh
  m.fsdp, m.tensor = 4, 2
  assert sharding.mesh_shape(m, 64) == (8, 4, 2)
  m.data = 3
  with pytest.raises(ConfigError, match='product is the 64 devices'):
    sharding.mesh_shape(m, 64)
  m.rules.mlp = 'tensor,bogus'
  with pytest.raises(ConfigError, match=r"mesh.rules.mlp='tensor,bogus' is invalid"):
    sharding.validate(m)


def test_multi_process_launch_detection():
  assert not distributed.launched_multi_process({})
  assert not distributed.launched_multi_process({'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '1'})
  assert distributed.launched_multi_process({'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '16'})
  assert distributed.launched_multi_process({'TPU_WORKER_HOSTNAMES': 'w0,w1,w2,w3'})
  assert not distributed.launched_multi_process({'TPU_WORKER_HOSTNAMES': 'localhost'})
