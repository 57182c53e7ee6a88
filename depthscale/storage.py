"""Every path a run reads or writes: a local path or a bucket URL (gs://, s3://, az://: the
schemes etils.epath gives to fsspec). One module, so that each store gets its own rules:

- atomic replace: locally a temporary file, fsync, then rename; in a bucket one object write
  (atomic there), since a bucket's rename is a copy and a delete;
- append: locally in place; a bucket object cannot be appended to, so an Appender keeps the
  object's content in memory and rewrites the whole object at each flush (the way
  TensorFlow's GCS files sync): a reader sees the object as of the last flush.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import hashlib
import importlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

from etils import epath
import fsspec

from depthscale.errors import ConfigError, WriteError, reason

PathLike = str | os.PathLike
# A run's files change while readers poll them (TensorBoard, results.load, a resume): bucket
# listings are read afresh every time, never from fsspec's listings cache.
fsspec.config.conf.setdefault('gs', {}).setdefault('use_listings_cache', False)
# The package each bucket scheme needs, and the depthscale extra that installs it.
FILESYSTEMS = {'gs': ('gcsfs', 'gcs'), 's3': ('s3fs', None), 'az': ('adlfs', None)}
AUTH_HINT = {'gs': 'run `gcloud auth application-default login` or set '
                   'GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (a TPU VM '
                   "uses its service account)"}


def is_url(path: PathLike) -> bool:
  """True for a bucket URL (scheme://...), False for a local path."""
  return '://' in os.fspath(path)


def _path(path: PathLike) -> epath.Path:
  path = os.fspath(path)
  return epath.Path(path if is_url(path) else os.path.expanduser(path))


def join(path: PathLike, *parts: str) -> str:
  """path/part/...; a bucket URL keeps its scheme."""
  return os.fspath(_path(path).joinpath(*parts))


def absolute(path: PathLike) -> str:
  """A local path made absolute; a bucket URL as it is."""
  return os.fspath(path) if is_url(path) else os.path.abspath(os.path.expanduser(path))


def name(path: PathLike) -> str:
  """The last component of path."""
  return _path(path).name


def parent(path: PathLike) -> str:
  return os.fspath(_path(path).parent)


def exists(path: PathLike) -> bool:
  return _path(path).exists()


def isdir(path: PathLike) -> bool:
  return _path(path).is_dir()


def isfile(path: PathLike) -> bool:
  return _path(path).is_file()


def listdir(path: PathLike) -> list[str]:
  """Names of the entries of a directory, sorted; [] if it does not exist."""
  p = _path(path)
  return sorted(c.name for c in p.iterdir()) if p.is_dir() else []


def glob(pattern: PathLike) -> list[str]:
  """Sorted paths matching a glob, files and directories: locally glob.glob's (`**`
  recurses, wildcards skip hidden names); in a bucket epath's (no `**`: one listing per
  directory level would cost thousands of requests)."""
  pattern = os.fspath(pattern)
  if not is_url(pattern):
    return sorted(glob_lib.glob(os.path.expanduser(pattern), recursive=True))
  parts = pattern.split('/')
  wild = next((i for i, part in enumerate(parts) if any(c in part for c in '*?[')), len(parts))
  base, rest = _path('/'.join(parts[:wild])), '/'.join(parts[wild:])
  return sorted(os.fspath(p) for p in (base.glob(rest) if rest else [base]) if p.exists())


def makedirs(path: PathLike) -> None:
  """Creates a directory and its parents (a bucket has no directories: nothing to do)."""
  if not is_url(path):
    _path(path).mkdir(parents=True, exist_ok=True)


def rename(src: PathLike, dst: PathLike) -> None:
  """Moves src (a file or a directory) to dst; in a bucket a copy then a delete, object by
  object (not atomic)."""
  _path(src).rename(_path(dst))


def read_bytes(path: PathLike) -> bytes:
  return _path(path).read_bytes()


def read_text(path: PathLike) -> str:
  return _path(path).read_text()


def read_json(path: PathLike) -> Any:
  return json.loads(read_text(path))


@contextlib.contextmanager
def open_file(path: PathLike, mode: str = 'rb') -> Iterator:
  """A file object for reading, or for writing a new file (not atomic: see write_bytes)."""
  with _path(path).open(mode) as f:
    yield f


@contextlib.contextmanager
def _writing(path: PathLike) -> Iterator[None]:
  """Turns any failure of a write into WriteError naming the path."""
  try:
    yield
  except Exception as e:  # each store raises its own errors (OSError, HTTP, auth)
    raise WriteError(f'{os.fspath(path)} could not be written ({reason(e)})') from e


def write_bytes(path: PathLike, data: bytes) -> None:
  """Replaces path's content with data in one step: a reader (or a rerun after a kill)
  sees the old content or the new, never a torn file. Raises WriteError."""
  with _writing(path):
    _replace(path, data)


def _replace(path: PathLike, data: bytes) -> None:
  if is_url(path):
    _path(path).write_bytes(data)
    return
  path = absolute(path)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f'.{os.path.basename(path)}.',
                             suffix='.tmp')
  try:
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the file from other readers
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise


def staging(dst: PathLike) -> str:
  """A local path to build dst in before publish(): hidden next to dst when dst is local
  (one filesystem: the rename is atomic), else in the temp directory."""
  if is_url(dst):
    return os.path.join(tempfile.gettempdir(), f'depthscale-{os.getpid()}-{name(dst)}')
  dst = absolute(dst)
  return os.path.join(os.path.dirname(dst), f'.{os.path.basename(dst)}.tmp')


def publish(local: str, dst: PathLike) -> None:
  """Moves a finished local file to dst: a rename when local, an upload (one object
  write) then a delete when dst is in a bucket."""
  if is_url(dst):
    with _writing(dst):
      _path(dst).write_bytes(_path(local).read_bytes())
    os.remove(local)
  else:
    os.replace(local, absolute(dst))


def local_copy(path: PathLike) -> str:
  """A local file with path's content, for readers that only open local files: path
  itself when local, else a copy in the cache directory ($DEPTHSCALE_CACHE or
  <temp>/depthscale-cache), fetched once and refetched when its size differs."""
  if not is_url(path):
    return os.fspath(path)
  cache = os.environ.get('DEPTHSCALE_CACHE') or os.path.join(tempfile.gettempdir(),
                                                               'depthscale-cache')
  os.makedirs(cache, exist_ok=True)
  key = hashlib.sha256(os.fspath(path).encode()).hexdigest()[:16]
  local = os.path.join(cache, f'{key}-{name(path)}')
  size = _path(path).stat().length
  if not os.path.isfile(local) or os.path.getsize(local) != size:
    fd, tmp = tempfile.mkstemp(dir=cache, suffix='.tmp')
    with os.fdopen(fd, 'wb') as f, _path(path).open('rb') as src:
      shutil.copyfileobj(src, f)
    os.replace(tmp, local)  # concurrent fetches of one file each publish a whole copy
  return local


def write_text(path: PathLike, text: str) -> None:
  """write_bytes of the UTF-8 text."""
  write_bytes(path, text.encode())


def write_json(path: PathLike, obj: Any, **dump_kwargs) -> None:
  """json.dumps(obj) written atomically to path."""
  write_text(path, json.dumps(obj, **dump_kwargs))


class Appender:
  """Appends bytes to a file whose content starts as `initial` (written at once if the file
  exists or initial is not empty, else at the first write).

  Local: each write goes to the file at once (flush has nothing left to do).
  Bucket: the content is held in memory and flush rewrites the object when it changed.
  """

  def __init__(self, path: PathLike, initial: bytes = b''):
    self.path = os.fspath(path)
    self._remote = is_url(path)
    self._content, self._dirty = bytearray(initial), False
    self._file = None
    if initial or exists(path):
      write_bytes(path, initial)

  def write(self, data: bytes) -> None:
    if self._remote:
      self._content += data
      self._dirty = True
      return
    with _writing(self.path):
      if self._file is None:
        self._file = open(absolute(self.path), 'ab')  # pylint: disable=consider-using-with
      self._file.write(data)
      self._file.flush()

  def flush(self) -> None:
    if self._dirty:
      write_bytes(self.path, bytes(self._content))
      self._dirty = False

  def close(self) -> None:
    self.flush()
    if self._file is not None:
      self._file.close()


def jsonl_lines(path: PathLike) -> list[str]:
  """The non-blank lines of a JSONL file ([] if there is none), less an unterminated last
  line that does not parse (a write cut short by a kill)."""
  text = read_text(path) if exists(path) else ''
  lines = [line + '\n' for line in text.split('\n') if line.strip()]
  if lines and not text.rstrip(' \t').endswith('\n'):
    try:
      json.loads(lines[-1])
    except json.JSONDecodeError:
      lines.pop()
  return lines


def read_jsonl(path: PathLike) -> list[dict]:
  """All records of a JSONL file (see jsonl_lines)."""
  return [json.loads(line) for line in jsonl_lines(path)]


def check_bucket(path: PathLike, field: str) -> None:
  """For a bucket URL: its filesystem package is installed, credentials are found (unless
  a local emulator serves the store) and the bucket exists. Reads only; raises ConfigError
  naming the field. A local path passes."""
  if not is_url(path):
    return
  url = os.fspath(path)
  scheme, rest = url.split('://', 1)
  package, extra = FILESYSTEMS.get(scheme, (None, None))
  if package is None:
    raise ConfigError(f'{field}={url!r} is invalid: allowed a local path or a gs://, s3:// or '
                      'az:// URL')
  try:
    importlib.import_module(package)
  except ImportError:
    install = f'pip install "depthscale[{extra}]"' if extra else f'pip install {package}'
    raise ConfigError(f'{field}={url!r} needs the {package} package for {scheme}:// paths: '
                      f'{install}') from None
  if scheme == 'gs' and not os.environ.get('STORAGE_EMULATOR_HOST'):
    _check_google_credentials(field, url)
  bucket = f'{scheme}://{rest.split("/", 1)[0]}'
  try:
    found = _path(bucket).exists()
  except Exception as e:  # the filesystems raise their own HTTP and auth errors
    raise ConfigError(f'{field}={url!r}: bucket {bucket} cannot be read ({reason(e)}); '
                      f'{AUTH_HINT.get(scheme, "check the credentials")}') from None
  if not found:
    raise ConfigError(f'{field}={url!r} is invalid: bucket {bucket} does not exist (allowed '
                      'an existing bucket: create it first)')


def _check_google_credentials(field: str, url: str) -> None:
  """Raises ConfigError if google-auth (installed with gcsfs) finds no default credentials."""
  auth = importlib.import_module('google.auth')
  try:
    auth.default()
  except auth.exceptions.DefaultCredentialsError:
    raise ConfigError(f'{field}={url!r}: no Google Cloud credentials found: '
                      f'{AUTH_HINT["gs"]}') from None
