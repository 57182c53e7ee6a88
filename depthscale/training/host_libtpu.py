"""libtpu on a host without a TPU: one host, this one, so that its start-up is quiet.

The `tpu` extra installs libtpu, and JAX starts it on any host: to probe for TPU devices
(a run without $JAX_PLATFORMS) and to compile for a TPU slice (`--dry_run --topology`).
Off a TPU VM there is no TPU metadata to read (JAX sets $TPU_SKIP_MDS_QUERY), and libtpu
says on stderr that it found neither the slice's host bounds (`Failed to find host bounds
for accelerator type`) nor its workers (`unexpected worker hostname 'WARNING: could not
determine TPU worker hostnames ...'`). Naming one host, this one, is true here and quiets
both; the compile-only devices of a slice come from its name, so the programs compiled for
it are the same. On a TPU host (a TPU device file) nothing is set: libtpu reads the slice
from the TPU VM's metadata.
"""

from __future__ import annotations

import glob
import os

# TPU chips: /dev/accel* on v4 and older, numbered VFIO groups /dev/vfio/N from v5 on.
TPU_DEVICE_FILES = ('accel*', 'vfio/[0-9]*')
ONE_HOST = {'TPU_HOST_BOUNDS': '1,1,1', 'TPU_WORKER_HOSTNAMES': 'localhost'}


def has_tpu(dev: str = '/dev') -> bool:
  """Whether a TPU device file exists under `dev`."""
  return any(glob.glob(os.path.join(dev, pattern)) for pattern in TPU_DEVICE_FILES)


def one_host_without_tpu(environ=os.environ, dev: str = '/dev') -> bool:
  """Without a TPU, sets libtpu's host bounds and worker hostnames to this one host (ONE_HOST,
  each unless set); whether this host has no TPU. Takes effect only before JAX starts libtpu
  (depthscale's import calls it)."""
  if has_tpu(dev):
    return False
  for key, value in ONE_HOST.items():
    environ.setdefault(key, value)
  return True
