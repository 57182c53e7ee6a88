"""A TCP proxy on 127.0.0.1 in front of a server (the tests' GCS server), for a store that
stops answering: it passes bytes through, or on command delays them, stalls connections
(holds them open and never answers: nothing is forwarded, nothing is closed), or drops
them (reset). A stall can also be aimed at requests: the next n HTTP requests whose request
line matches a pattern stall their connection, every other request passes.

The proxy runs on threads of the test process; the clients under test (a run's gcsfs and
tensorstore) reach it over real sockets, pointed at it by `env` as at the server itself.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time

MODES = ('pass', 'delay', 'stall', 'drop')
_REQUEST_LINE = re.compile(rb'^([A-Z]+ \S+) HTTP/1\.[01]\r?$', re.MULTILINE)


class StallProxy:
  """Forwards 127.0.0.1:port to 127.0.0.1:upstream_port; `mode` applies to every
  connection at its next chunk of bytes."""

  def __init__(self, upstream_port: int):
    self.upstream_port = upstream_port
    self.mode, self.delay_s = 'pass', 0.0
    self.requests: list[str] = []  # every request line seen, 'METHOD target'
    self.stalled: list[str] = []  # the request lines whose connection was stalled
    self.stalled_at: list[float] = []  # when each was stalled (time.monotonic())
    self._rules: list[list] = []  # [compiled pattern, matches to pass first, stalls left]
    self._held: list[socket.socket] = []  # sockets of stalled connections: kept open
    self._lock = threading.Lock()
    self._closed = threading.Event()
    self._server = socket.create_server(('127.0.0.1', 0))
    self.port = self._server.getsockname()[1]
    self.url = f'http://127.0.0.1:{self.port}'
    threading.Thread(target=self._accept, name='stall-proxy', daemon=True).start()

  def env(self, server_env: dict) -> dict:
    """The server's client settings (tests/gcs.py), pointed at the proxy."""
    return {k: self.url if v.startswith('http://127.0.0.1') else v
            for k, v in server_env.items()}

  def set(self, mode: str, delay_s: float = 0.0) -> None:
    """pass, delay (each chunk waits delay_s), stall (no byte forwarded, nothing closed; a
    stalled connection stays stalled) or drop (every connection reset at its next chunk)."""
    assert mode in MODES, mode
    self.mode, self.delay_s = mode, delay_s

  def stall_requests(self, pattern: str, times: int = 1 << 30, skip: int = 0) -> None:
    """Of the requests whose request line ('METHOD target') matches the regular expression
    `pattern`, the first `skip` pass and the next `times` stall their connection."""
    with self._lock:
      self._rules.append([re.compile(pattern), skip, times])

  def clear(self) -> None:
    """Back to passing everything (connections stalled so far stay stalled)."""
    with self._lock:
      self._rules.clear()
    self.set('pass')

  def close(self) -> None:
    self._closed.set()
    self._server.close()
    with self._lock:
      for s in self._held:
        s.close()

  def _accept(self) -> None:
    while not self._closed.is_set():
      try:
        client, _ = self._server.accept()
      except OSError:
        return
      if self.mode == 'drop':
        _reset(client)
        continue
      try:
        upstream = socket.create_connection(('127.0.0.1', self.upstream_port))
      except OSError:
        _reset(client)
        continue
      link = _Link(client, upstream)
      for src, dst, requests in ((client, upstream, True), (upstream, client, False)):
        threading.Thread(target=self._pump, args=(link, src, dst, requests),
                         name='stall-proxy-pump', daemon=True).start()

  def _stalls(self, chunk: bytes) -> bool:
    """Records the request lines of a client chunk; True if one of them is to stall."""
    lines = [m.group(1).decode('latin-1') for m in _REQUEST_LINE.finditer(chunk)]
    with self._lock:
      self.requests += lines
      for line in lines:
        for rule in self._rules:
          if rule[2] > 0 and rule[0].search(line):
            if rule[1] > 0:
              rule[1] -= 1
              continue
            rule[2] -= 1
            self.stalled.append(line)
            self.stalled_at.append(time.monotonic())
            return True
    return False

  def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, requests: bool) -> None:
    while True:
      try:
        chunk = src.recv(1 << 16)
      except OSError:
        chunk = b''
      if requests and chunk and (self.mode == 'stall' or self._stalls(chunk)):
        link.stalled = True
      elif self.mode == 'stall' and chunk:
        link.stalled = True
      if link.stalled:
        with self._lock:
          self._held += [link.client, link.upstream]
        return  # the other direction stops at its next chunk; the sockets stay open
      if self.mode == 'drop' and chunk:
        _reset(link.client)
        link.upstream.close()
        return
      if self.mode == 'delay':
        time.sleep(self.delay_s)
      try:
        if not chunk:
          dst.shutdown(socket.SHUT_WR)
          return
        dst.sendall(chunk)
      except OSError:
        return


class _Link:
  """The two sockets of one proxied connection."""

  def __init__(self, client: socket.socket, upstream: socket.socket):
    self.client, self.upstream = client, upstream
    self.stalled = False


def _reset(s: socket.socket) -> None:
  """Closes with a TCP reset (SO_LINGER 0), as a dropped connection reads to its peer."""
  try:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
  finally:
    s.close()
