"""Files this host keeps between runs, in $XDG_CACHE_HOME/depthscale (default
~/.cache/depthscale): facts of the machine and its Python installation, never of a run (the
CPU options of training/cpu_calibration.py, the python_docs corpus of data/python_docs.py).
Each is rebuilt when missing or stale, so deleting the directory loses nothing."""

from __future__ import annotations

import os
import sys


def path(name: str, env: str) -> str:
  """The cache file `name`, or the path in the environment variable `env` where it is set."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.environ.get(env) or os.path.join(root, 'depthscale', name)


def write(path: str, data: bytes, what: str) -> bool:
  """Writes a cache file atomically (a temporary file, then a rename); False with one warning
  line naming `what` where it cannot be written."""
  tmp = f'{path}.{os.getpid()}.tmp'
  try:
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    with open(tmp, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
    return True
  except OSError as e:
    print(f'warning: {what} {path} not written ({e})', file=sys.stderr, flush=True)
    return False
