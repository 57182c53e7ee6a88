"""Multi-host start-up (jax.distributed.initialize() when launched as several processes) and
agreement across processes on a flag."""

from __future__ import annotations

import itertools
import os
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from depthscale.training import host_threads


def launched_multi_process(env: Mapping[str, str]) -> bool:
  """True under a multi-task SLURM step, a multi-worker TPU pod or an MPI launch."""
  counts = (env.get('SLURM_NTASKS', '1') if 'SLURM_JOB_ID' in env else '1',
            env.get('OMPI_COMM_WORLD_SIZE', '1'))
  tpu_workers = [h for h in env.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]
  return (any(int(c) > 1 for c in counts) or len(tpu_workers) > 1
          or 'MEGASCALE_COORDINATOR_ADDRESS' in env)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, force: bool = False) -> bool:
  """Joins the job's processes before any JAX computation; True if it did.

  Explicit coordinator flags win; otherwise JAX detects the cluster itself (TPU pod
  metadata, SLURM, Open MPI) when `force` is set or the environment shows a multi-process
  launch. A single process on one host needs nothing.
  """
  if coordinator_address:
    host_threads.xla_default()
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
  if force or launched_multi_process(os.environ):
    host_threads.xla_default()
    jax.distributed.initialize()
    return True
  return False


class AnyProcess:
  """Agrees across processes on a flag any one of them raised (SIGTERM seen by one host).

  One process: the flag itself, at once. Several: each call dispatches a tiny max over
  every device of the mesh (queued behind the step just dispatched, never waited on at
  once) and answers with the previous call's agreed value, whose step has finished by
  then; every process gets the same answer at the same call."""

  def __init__(self, mesh: Mesh):
    self.multi = jax.process_count() > 1
    self._pending: jax.Array | None = None
    if self.multi:
      self._sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
      self._shape = (mesh.size,)
      self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, PartitionSpec())).lower(
          jax.ShapeDtypeStruct(self._shape, jnp.int32, sharding=self._sharding)).compile()

  def __call__(self, flag: bool) -> bool:
    if not self.multi:
      return flag
    local = [jax.device_put(np.full((1,), flag, np.int32), d)
             for d in self._sharding.addressable_devices_indices_map(self._shape)]
    vote = self._max(jax.make_array_from_single_device_arrays(self._shape, self._sharding, local))
    agreed, self._pending = self._pending, vote
    return agreed is not None and bool(agreed)


_barriers = itertools.count()


def barrier(what: str, timeout_s: float) -> None:
  """Waits until every process gets here: the coordination service's barrier, no device work
  (so no collective library's set-up limit). Nothing on one process."""
  if jax.process_count() > 1:
    client = jax._src.distributed.global_state.client  # pylint: disable=protected-access
    client.wait_at_barrier(f'depthscale/{next(_barriers)}/{what}', int(timeout_s * 1000))
