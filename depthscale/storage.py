"""Every path a run reads or writes: a local path or a bucket URL (gs://, s3://, az://: the
schemes etils.epath gives to fsspec). One module, so that each store gets its own rules:

- atomic replace: locally a temporary file, fsync, then rename; in a bucket one object write
  (atomic there), since a bucket's rename is a copy and a delete;
- append: locally in place; a bucket object cannot be appended to, so an Appender keeps the
  object's content in memory and rewrites the whole object at each flush (the way
  TensorFlow's GCS files sync): a reader sees the object as of the last flush;
- deadlines: every request to a bucket gets an answer within deadline() seconds (retries
  included) or raises StoreTimeout; each attempt of the clients (gcsfs, tensorstore) gives up
  after deadline() / ATTEMPTS without progress, and the client retries it with backoff.
"""

from __future__ import annotations

import contextlib
import functools
import glob as glob_lib
import hashlib
import importlib
import json
import math
import os
import tempfile
import threading
from typing import Any, Callable, Iterator, TypeVar

from etils import epath
import fsspec

from depthscale.errors import ConfigError, StoreTimeout, WriteError, reason

PathLike = str | os.PathLike
T = TypeVar('T')
DEADLINE_ENV = 'DEPTHSCALE_STORAGE_DEADLINE'
DEFAULT_DEADLINE_S = 300.0  # one bucket operation, its retries included
ATTEMPTS = 5  # an attempt gives up after deadline / ATTEMPTS without progress
COPY_CHUNK = 8 << 20  # a shard cache fill reads this much per bounded request
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
  return bounded(path, 'looked up', _path(path).exists)


def isdir(path: PathLike) -> bool:
  return bounded(path, 'looked up', _path(path).is_dir)


def isfile(path: PathLike) -> bool:
  return bounded(path, 'looked up', _path(path).is_file)


def listdir(path: PathLike) -> list[str]:
  """Names of the entries of a directory, sorted; [] if it does not exist."""
  p = _path(path)
  return bounded(path, 'listed', lambda: sorted(c.name for c in p.iterdir()) if p.is_dir()
                 else [])


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
  return bounded(pattern, 'listed', lambda: sorted(
      os.fspath(p) for p in (base.glob(rest) if rest else [base]) if p.exists()))


def makedirs(path: PathLike) -> None:
  """Creates a directory and its parents (a bucket has no directories: nothing to do)."""
  if not is_url(path):
    _path(path).mkdir(parents=True, exist_ok=True)


def rename(src: PathLike, dst: PathLike) -> None:
  """Moves src (a file or a directory) to dst; in a bucket a copy then a delete, object by
  object (not atomic)."""
  bounded(src, f'moved to {os.fspath(dst)}', lambda: _path(src).rename(_path(dst)))


def read_bytes(path: PathLike) -> bytes:
  return bounded(path, 'read', _path(path).read_bytes)


def read_text(path: PathLike) -> str:
  return bounded(path, 'read', _path(path).read_text)


def read_json(path: PathLike) -> Any:
  return json.loads(read_text(path))


@contextlib.contextmanager
def open_file(path: PathLike, mode: str = 'rb') -> Iterator:
  """A file object for reading, or for writing a new file (not atomic: see write_bytes); in
  a bucket the opening is bounded by the deadline, reads and writes of the object are not."""
  f = bounded(path, 'opened', lambda: _path(path).open(mode))
  with f:
    yield f


@contextlib.contextmanager
def _writing(path: PathLike) -> Iterator[None]:
  """Turns any failure of a write into WriteError naming the path."""
  try:
    yield
  except WriteError:
    raise
  except Exception as e:  # each store raises its own errors (OSError, HTTP, auth)
    raise WriteError(f'{os.fspath(path)} could not be written ({reason(e)})') from e


def write_bytes(path: PathLike, data: bytes) -> None:
  """Replaces path's content with data in one step: a reader (or a rerun after a kill)
  sees the old content or the new, never a torn file. Raises WriteError."""
  with _writing(path):
    _replace(path, data)


def _replace(path: PathLike, data: bytes) -> None:
  if is_url(path):
    bounded(path, 'written', lambda: _path(path).write_bytes(data))
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
    with open(local, 'rb') as f:
      write_bytes(dst, f.read())
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
  size = bounded(path, 'looked up', lambda: _path(path).stat().length)
  if not os.path.isfile(local) or os.path.getsize(local) != size:
    fd, tmp = tempfile.mkstemp(dir=cache, suffix='.tmp')
    with os.fdopen(fd, 'wb') as f, open_file(path) as src:
      while chunk := bounded(path, 'read', lambda: src.read(COPY_CHUNK)):  # progress, or end
        f.write(chunk)
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
    found = exists(bucket)
  except StoreTimeout as e:
    raise StoreTimeout(f'{field}={url!r}: bucket check: {e}; nothing was written',
                       e.cause) from None
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


def deadline() -> float:
  """Seconds a bucket operation may go unanswered, its retries included:
  $DEPTHSCALE_STORAGE_DEADLINE, else DEFAULT_DEADLINE_S."""
  value = os.environ.get(DEADLINE_ENV, '')
  try:
    seconds = float(value) if value else DEFAULT_DEADLINE_S
  except ValueError:
    seconds = float('nan')
  if not 0 < seconds < math.inf:
    raise ConfigError(f'{DEADLINE_ENV}={value!r} is invalid: allowed a number of seconds > 0')
  return seconds


@functools.cache
def _configure_clients() -> None:
  """Per-attempt timeouts of the bucket clients, deadline() / ATTEMPTS each, set before either
  opens a connection: gcsfs (aiohttp) gives up an attempt that cannot connect or receives no
  byte for that long, and retries it (6 attempts, waits of 1, 2, 4, 8, 16 s); tensorstore
  (curl, orbax's array storage) one that cannot connect or moves under 256 bytes/s for that
  long (whole seconds), and retries it (exponential backoff from 1 s to 32 s)."""
  attempt = deadline() / ATTEMPTS
  try:
    aiohttp = importlib.import_module('aiohttp')  # installed with gcsfs
    fsspec.config.conf.setdefault('gs', {})['requests_timeout'] = aiohttp.ClientTimeout(
        sock_connect=attempt, sock_read=attempt)
  except ImportError:
    pass
  seconds = str(max(1, math.ceil(attempt)))
  os.environ['TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS'] = seconds  # read at its first request
  os.environ['TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS'] = seconds


def bounded(path: PathLike, doing: str, fn: Callable[[], T], seconds: float | None = None) -> T:
  """fn(), an operation on path: at once for a local path; for a bucket URL on a helper
  thread, waited for at most `seconds` (default deadline()), after which StoreTimeout ('PATH
  could not be DOING: ...') is raised and the thread is left to its clients' own timeouts
  (the run ends: nothing waits for it). The caller's thread stays responsive to signals."""
  if not is_url(path):
    return fn()
  seconds = deadline() if seconds is None else seconds
  _configure_clients()
  done, out = threading.Event(), {}

  def run() -> None:
    try:
      out['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-exception-caught
      out['error'] = e
    finally:
      done.set()

  threading.Thread(target=run, name='depthscale-storage', daemon=True).start()
  if not done.wait(seconds):
    cause = f'the store did not answer within {seconds:g} s ({DEADLINE_ENV})'
    raise StoreTimeout(f'{os.fspath(path)} could not be {doing}: {cause}', cause)
  if 'error' in out:
    raise out['error']
  return out['value']
