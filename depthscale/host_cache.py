"""Files this host keeps between runs, in $XDG_CACHE_HOME/depthscale (default
~/.cache/depthscale): facts of the machine and its Python installation, never of a run (the
CPU options of training/cpu_calibration.py, the python_docs corpus of data/python_docs.py).
Each is rebuilt when missing or stale, so deleting the directory loses nothing."""

from __future__ import annotations

import os


def path(name: str, env: str) -> str:
  """The cache file `name`, or the path in the environment variable `env` where it is set."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.environ.get(env) or os.path.join(root, 'depthscale', name)
