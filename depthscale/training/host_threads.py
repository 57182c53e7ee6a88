"""XLA-CPU thread pools with room for collectives across several host devices.

With `--xla_force_host_platform_device_count=N` (a mesh of fake CPU devices), XLA-CPU sizes
its dispatch and intra-op pools to max(cores, N) threads: one per device on a small machine.
A collective holds its pool thread until every participant arrives; when the waiting
collectives hold every thread, the work that would bring the missing participants waits in
the queue forever (8-device analyses hung so on a 2-core machine: devices in an all-reduce
of all 8 and an all-gather of 4, the rest never arriving). Several threads per device leave
room; the cost is idle threads. Across processes (gloo) the extra concurrency hung a
two-process run instead, so jax.distributed start-up restores XLA's default.
"""

from __future__ import annotations

import os
import re

THREADS_PER_DEVICE = 4
_DEVICE_COUNT = re.compile(r'--xla_force_host_platform_device_count=(\d+)')
_SET_HERE = 'DEPTHSCALE_SET_PJRT_NPROC'


def forced_device_count(xla_flags: str) -> int:
  """The fake CPU device count that XLA_FLAGS asks for (1 if none)."""
  counts = _DEVICE_COUNT.findall(xla_flags)
  return int(counts[-1]) if counts else 1


def enough_for_collectives(environ=os.environ) -> bool:
  """Sets $PJRT_NPROC (XLA-CPU's pool size) to THREADS_PER_DEVICE threads per fake device,
  unless it or $NPROC is set or there is one device; whether set. Takes effect only before
  JAX creates its CPU client (depthscale's import calls it)."""
  devices = forced_device_count(environ.get('XLA_FLAGS', ''))
  if devices < 2 or 'PJRT_NPROC' in environ or 'NPROC' in environ:
    return False
  environ['PJRT_NPROC'] = environ[_SET_HERE] = str(max(os.cpu_count() or 1,
                                                        THREADS_PER_DEVICE * devices))
  return True


def xla_default(environ=os.environ) -> None:
  """Undoes enough_for_collectives (not a user's own setting): for multi-process runs."""
  if _SET_HERE in environ and environ.get('PJRT_NPROC') == environ.pop(_SET_HERE):
    del environ['PJRT_NPROC']


def single_thread_lapack(environ=os.environ) -> bool:
  """Sets $OPENBLAS_NUM_THREADS=1 unless set; whether set. XLA-CPU runs LAPACK (the
  analyses' SVDs) on scipy's OpenBLAS, whose threads spin-wait on small matrices: on a
  loaded 2-core host a d_model 64, L16 analysis took 4.6 s threaded, 0.26 s on one thread
  (benchmarks/NOTES.md). XLA's own dots do not use it. Takes effect only if that library
  loads afterwards (depthscale's import calls it; JAX loads it on first use of LAPACK)."""
  if 'OPENBLAS_NUM_THREADS' in environ:
    return False
  environ['OPENBLAS_NUM_THREADS'] = '1'
  return True
