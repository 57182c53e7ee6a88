"""Atomic file writes: a temporary file in the same directory, then os.replace, so a
reader (or a rerun after a kill) sees the old content or the new, never a torn file."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_text(path: str | os.PathLike, text: str) -> None:
  """Replaces path's content with text in one step (the file is fsynced first)."""
  path = os.fspath(path)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or '.',
                             prefix=f'.{os.path.basename(path)}.', suffix='.tmp')
  try:
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the file from other readers
    with os.fdopen(fd, 'w') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def write_json(path: str | os.PathLike, obj: Any, **dump_kwargs) -> None:
  """json.dumps(obj) written atomically to path."""
  write_text(path, json.dumps(obj, **dump_kwargs))
