"""`python_docs`: the English prose that ships with every Python installation.

Documents, in this order: the pydoc topics (`pydoc_data.topics.topics`, the reference
manual's sections that `help()` shows; sorted by topic name), then one document per source
file of the standard library (every `*.py` under `sysconfig.get_paths()['stdlib']` except
`site-packages`, `test`/`tests` and `idlelib` directories; sorted by relative path): its
module, class and function docstrings in source order, separated by blank lines, read
with `ast.get_docstring` so no module is imported. Files that do not parse are skipped.
The corpus is a pure function of the Python installation: same version, same documents
and hash (`info()['sha256']`, recorded in each run's data_info.json).

Parsing the standard library takes seconds of CPU, once per process: on a launcher's host
that is every rung. So the documents are kept in a host cache file (depthscale.host_cache;
$DEPTHSCALE_PYTHON_DOCS_CACHE sets its path), stamped with the Python version and each
source file's size and modification time (what Python's own .pyc check compares), and
parsed again when the stamp differs or the file is unreadable.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import platform
import sys
import sysconfig
import warnings

import numpy as np
from pydoc_data import topics

from depthscale import host_cache

_DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_SKIP_DIRS = {'site-packages', 'dist-packages', 'test', 'tests', 'idlelib', '__pycache__'}
CACHE_ENV = 'DEPTHSCALE_PYTHON_DOCS_CACHE'  # the cache file (default: see cache_path)


def _topics() -> list[str]:
  return [topics.topics[k] for k in sorted(topics.topics)]


def _sources(root: str) -> list[str]:
  """The standard library's source files under root, relative and sorted."""
  paths = []
  for d, subdirs, files in os.walk(root):
    subdirs[:] = [s for s in subdirs if s not in _SKIP_DIRS]
    paths += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith('.py')]
  return sorted(paths)


def _module_docstrings(root: str, paths: list[str]) -> list[str]:
  docs = []
  for rel in paths:
    try:
      with open(os.path.join(root, rel), 'rb') as f:
        with warnings.catch_warnings():
          warnings.simplefilter('ignore')  # e.g. invalid escape sequences in old sources
          doc = '\n\n'.join(_docstrings(ast.parse(f.read())))
    except (SyntaxError, ValueError, UnicodeDecodeError):
      continue
    if doc:
      docs.append(doc)
  return docs


def _docstrings(node: ast.AST) -> list[str]:
  """The docstrings of a module, class or function and of the definitions in it, in order."""
  own = ast.get_docstring(node) if isinstance(node, _DEFS) else None
  out = [own.strip()] if own and own.strip() else []
  for child in getattr(node, 'body', []):
    if isinstance(child, _DEFS) or hasattr(child, 'body'):
      out += _docstrings(child)
  return out


def cache_path() -> str:
  """$DEPTHSCALE_PYTHON_DOCS_CACHE, else python_docs.bin in the host's cache directory."""
  return host_cache.path('python_docs.bin', CACHE_ENV)


def _stamp(root: str, paths: list[str]) -> str:
  """The Python version, root, and every source file's path, size and modification time."""
  h = hashlib.sha256(f'{sys.version}\0{root}'.encode())
  for rel in paths:
    st = os.stat(os.path.join(root, rel))
    h.update(f'\0{rel}\0{st.st_size}\0{st.st_mtime_ns}'.encode())
  return h.hexdigest()


def _read_cache(path: str, stamp: str) -> tuple[bytes, ...] | None:
  """The cached documents if the file holds this stamp's; None if it is missing or stale,
  and with one warning line if it is unreadable (it is then rewritten)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, 'rb') as f:
      header = json.loads(f.readline())
      if header.get('stamp') != stamp:
        return None
      sizes = np.frombuffer(f.read(8 * header['documents']), '<u8')
      blob = f.read()
    if len(sizes) != header['documents'] or int(sizes.sum()) != len(blob):
      raise ValueError(f'{len(blob)} bytes of documents, the header says {int(sizes.sum())}')
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    print(f'warning: python_docs cache {path} ignored ({e})', file=sys.stderr, flush=True)
    return None
  ends = np.cumsum(sizes)
  return tuple(blob[int(e - n):int(e)] for e, n in zip(ends, sizes))


def _encode(stamp: str, docs: tuple[bytes, ...]) -> bytes:
  """The cache file: a JSON header line (stamp, count), the sizes, then the documents."""
  header = json.dumps({'stamp': stamp, 'documents': len(docs)}).encode() + b'\n'
  return header + np.array([len(d) for d in docs], '<u8').tobytes() + b''.join(docs)


def load(root: str) -> tuple[bytes, ...]:
  """The documents of the standard library at root as UTF-8 (topics, then module
  docstrings), from the host cache when its stamp matches, else parsed and cached."""
  paths = _sources(root)
  path, stamp = cache_path(), _stamp(root, paths)
  cached = _read_cache(path, stamp)
  if cached is not None:
    return cached
  docs = _topics() + _module_docstrings(root, paths)
  docs = tuple(d.strip().encode('utf-8') for d in docs if d.strip())
  host_cache.write(path, _encode(stamp, docs), 'python_docs cache')
  return docs


@functools.lru_cache(maxsize=1)
def documents() -> tuple[bytes, ...]:
  """The corpus's documents as UTF-8 (topics, then module docstrings)."""
  return load(sysconfig.get_paths()['stdlib'])


@functools.lru_cache(maxsize=1)
def info() -> dict:
  """Provenance: Python version, document count, size and sha256 over the documents."""
  docs = documents()
  h = hashlib.sha256()
  for d in docs:
    h.update(len(d).to_bytes(8, 'little'))
    h.update(d)
  return {'corpus': 'python_docs', 'python': platform.python_version(),
          'documents': len(docs), 'bytes': sum(map(len, docs)), 'sha256': h.hexdigest()}
