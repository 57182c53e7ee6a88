"""XLA-CPU pools with several threads per fake device: collectives that hold threads while
they wait cannot take the last one; multi-process runs get XLA's default back."""

import os
import subprocess
import sys

from depthscale.training import host_threads
from tests.helpers import fake_cpu_env
# A sum over 8 fake devices, then XLA's intra-op worker threads of this process, counted.
PROBE = """
import collections, os
import depthscale
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
x = jax.device_put(jnp.ones(64), NamedSharding(Mesh(jax.devices(), ('d',)), P('d')))
assert float(jax.jit(jnp.sum)(x)) == 64
names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]
print(collections.Counter(names)['tf_XLAEigen'])
"""
WANT = max(os.cpu_count(), 8 * host_threads.THREADS_PER_DEVICE)


def test_fake_devices_get_several_threads_each_unless_the_user_chose():
  flags = '--xla_cpu_foo=1 --xla_force_host_platform_device_count=8'
  assert host_threads.forced_device_count(flags) == 8
  assert host_threads.forced_device_count('') == 1
  env = {'XLA_FLAGS': flags}
  assert host_threads.enough_for_collectives(env) and int(env['PJRT_NPROC']) == WANT
  host_threads.xla_default(env)
  assert env == {'XLA_FLAGS': flags}
  for kept in ({'XLA_FLAGS': flags, 'PJRT_NPROC': '3'}, {'XLA_FLAGS': flags, 'NPROC': '3'},
               {'XLA_FLAGS': '--xla_force_host_platform_device_count=1'}, {}):
    before = dict(kept)
    assert not host_threads.enough_for_collectives(kept) and kept == before
    host_threads.xla_default(kept)
    assert kept == before  # a user's own setting stays


def test_xla_cpu_starts_the_threads_asked_for():
  env = {k: v for k, v in fake_cpu_env(8).items() if k not in ('PJRT_NPROC', 'NPROC')}
  out = subprocess.run([sys.executable, '-c', PROBE], env=env, capture_output=True, text=True,
                       check=True)
  assert int(out.stdout.split()[-1]) == WANT


LAPACK_PROBE = """
import ctypes
import depthscale
import jax.numpy as jnp
jnp.linalg.svd(jnp.ones((64, 256)), compute_uv=False).block_until_ready()
libs = {l.split()[-1] for l in open('/proc/self/maps') if 'libscipy_openblas-' in l}
print(ctypes.CDLL(libs.pop()).scipy_openblas_get_num_threads() if libs else 'none')
"""


def test_lapack_runs_on_one_thread_unless_the_user_chose():
  env = {}
  assert host_threads.single_thread_lapack(env) and env == {'OPENBLAS_NUM_THREADS': '1'}
  assert not host_threads.single_thread_lapack(env := {'OPENBLAS_NUM_THREADS': '2'}) and env == {
      'OPENBLAS_NUM_THREADS': '2'}
  clean = {k: v for k, v in os.environ.items() if k != 'OPENBLAS_NUM_THREADS'}
  out = subprocess.run([sys.executable, '-c', LAPACK_PROBE], env=clean, capture_output=True,
                       text=True, check=True).stdout.split()[-1]
  assert out == '1'
