"""`python_docs`: the English prose that ships with every Python installation.

Documents, in this order: the pydoc topics (`pydoc_data.topics.topics`, the reference
manual's sections that `help()` shows; sorted by topic name), then one document per source
file of the standard library (every `*.py` under `sysconfig.get_paths()['stdlib']` except
`site-packages`, `test`/`tests` and `idlelib` directories; sorted by relative path): its
module, class and function docstrings in source order, separated by blank lines, read
with `ast.get_docstring` so no module is imported. Files that do not parse are skipped.
The corpus is a pure function of the Python installation: same version, same documents
and hash (`info()['sha256']`, recorded in each run's data_info.json).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import platform
import sysconfig
import warnings

from pydoc_data import topics

_DEFS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_SKIP_DIRS = {'site-packages', 'dist-packages', 'test', 'tests', 'idlelib', '__pycache__'}


def _topics() -> list[str]:
  return [topics.topics[k] for k in sorted(topics.topics)]


def _module_docstrings(root: str) -> list[str]:
  paths = []
  for d, subdirs, files in os.walk(root):
    subdirs[:] = [s for s in subdirs if s not in _SKIP_DIRS]
    paths += [os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith('.py')]
  docs = []
  for rel in sorted(paths):
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


@functools.lru_cache(maxsize=1)
def documents() -> tuple[bytes, ...]:
  """The corpus's documents as UTF-8 (topics, then module docstrings)."""
  docs = _topics() + _module_docstrings(sysconfig.get_paths()['stdlib'])
  return tuple(d.strip().encode('utf-8') for d in docs if d.strip())


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
