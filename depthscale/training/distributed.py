"""Multi-host start-up: jax.distributed.initialize() when launched as several processes."""

from __future__ import annotations

import os
from typing import Mapping

import jax


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
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
  if force or launched_multi_process(os.environ):
    jax.distributed.initialize()
    return True
  return False
