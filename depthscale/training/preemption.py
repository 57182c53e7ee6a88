"""SIGTERM, what TPU pods and SLURM send before they take a machine back (and kill it some
30 s later): the loop saves a checkpoint at the next step and ends. If the process has not
ended GRACE_S after the signal (a store that does not answer, a thread blocked in I/O or in
native code), it prints one line naming the last complete checkpoint and exits with
EXIT_CODE, whatever its threads are waiting on."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

GRACE_S = 25.0  # from SIGTERM to the end of the process, at most
EXIT_CODE = 5  # as a failed write (depthscale.main)


class Preemption:
  """Turns SIGTERM into a flag the loop checks between steps, and into a hard deadline.

  The flag is set by a Python handler (which runs on the main thread between bytecodes) and
  by a thread reading the signal wakeup fd, which the interpreter's C handler writes to at
  once even while the main thread is blocked in native code; the same thread arms the
  deadline. `kept` says where a rerun resumes, without asking the store.
  """

  def __init__(self, name: str, kept: Callable[[], str]):
    self.name, self._kept = name, kept
    self.requested = False
    self._timer: threading.Timer | None = None
    self._main = False

  def __enter__(self) -> Preemption:
    self._main = threading.current_thread() is threading.main_thread()
    if self._main:  # signal handlers and the wakeup fd can only be set from the main thread
      self._old = signal.signal(signal.SIGTERM, self._handle)
      read, self._write = os.pipe()
      os.set_blocking(self._write, False)
      self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
      threading.Thread(target=self._watch, args=(read,), name='depthscale-sigterm',
                       daemon=True).start()
    return self

  def _handle(self, *_) -> None:
    self.requested = True

  def _watch(self, read: int) -> None:
    """Signal numbers from the wakeup fd until it is closed."""
    with os.fdopen(read, 'rb', buffering=0) as f:
      while signals := f.read(64):
        if signal.SIGTERM in signals:
          self.requested = True
          self._arm()

  def _arm(self) -> None:
    if self._timer is None:
      self._timer = threading.Timer(GRACE_S, self._expire)
      self._timer.daemon = True
      self._timer.start()

  def _expire(self) -> None:
    sys.stdout.flush()
    print(f'error: {self.name + " " if self.name else ""}SIGTERM: the run did not end within '
          f'{GRACE_S:g} s of it; {self._kept()}', file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)  # threads blocked in I/O or native code: no clean shutdown

  def __exit__(self, *_) -> None:
    """Restores the handler; a deadline already armed stays armed until the process ends."""
    if self._main:
      signal.set_wakeup_fd(self._old_fd)
      os.close(self._write)  # the watching thread reads the end and closes its side
      signal.signal(signal.SIGTERM, self._old)
