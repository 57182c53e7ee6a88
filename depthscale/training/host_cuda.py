"""JAX's CUDA plugin on a host without a GPU: its compiler without its driver check.

The `gpu` extra installs JAX's CUDA plugin, and JAX starts it on any host: to probe for GPU
devices (a run without $JAX_PLATFORMS) and to compile for GPU nodes (`--dry_run
--topology=h100-8`). At start-up the plugin checks the versions of the CUDA libraries the
driver loads; on a host without a GPU there is no driver, the check fails (a traceback on
stderr: `Unable to load cuPTI`) and the plugin is left unregistered, compiler included. So
on a host without an NVIDIA device file the check is skipped: the plugin registers its
compiler, and its GPU client fails quietly for lack of a GPU. A GPU host is left as it is.
"""

from __future__ import annotations

import glob
import os

# NVIDIA's device files: the control device exists wherever the driver runs a GPU.
NVIDIA_DEVICE_FILES = ('nvidiactl', 'nvidia[0-9]*')


def has_gpu(dev: str = '/dev') -> bool:
  """Whether an NVIDIA device file exists under `dev`."""
  return any(glob.glob(os.path.join(dev, pattern)) for pattern in NVIDIA_DEVICE_FILES)


def skip_driver_check_without_gpu(environ=os.environ, dev: str = '/dev') -> bool:
  """Without an NVIDIA device file under `dev`, sets JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (unless
  set): the CUDA plugin's check of the driver's libraries would fail and leave the plugin
  unregistered. Takes effect only before JAX loads its plugins (depthscale's import calls
  it); whether this host has no GPU."""
  if has_gpu(dev):
    return False
  environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  return True
