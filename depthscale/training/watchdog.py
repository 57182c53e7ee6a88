"""A watchdog thread: a phase of the loop that makes no progress for too long (a collective
waiting on a lost process, a stuck read) prints where it is and exits the process non-zero,
so that a pod job fails loudly instead of hanging."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

EXIT_CODE = 4  # 2: bad input, 3: non-finite loss (depthscale.main)


class Watchdog:
  """Exits with EXIT_CODE when the phase last entered has lasted over `seconds` (0 = off).

  The loop calls enter(phase, step) at each phase (every entry counts as progress) and
  pause() around work that may legitimately take long and involves no other process
  (compilation)."""

  def __init__(self, seconds: float, name: str = '', process: int = 0):
    self.seconds, self.name, self.process = float(seconds), name, process
    self._where: tuple[str, int | None, float] | None = None  # (phase, step, since)
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def enter(self, phase: str, step: int | None = None) -> None:
    self._where = (phase, step, time.monotonic())  # one assignment: atomic for the thread

  def pause(self) -> None:
    self._where = None

  def __enter__(self) -> Watchdog:
    if self.seconds > 0:
      self._thread = threading.Thread(target=self._watch, name='depthscale-watchdog', daemon=True)
      self._thread.start()
    return self

  def __exit__(self, *_) -> None:
    self._stop.set()
    if self._thread:
      self._thread.join()

  def _watch(self) -> None:
    while not self._stop.wait(min(self.seconds / 4, 10.0)):
      where = self._where
      if where and time.monotonic() - where[2] > self.seconds:
        self._fire(*where)

  def _fire(self, phase: str, step: int | None, since: float) -> None:
    at = '' if step is None else f' at step {step}'
    print(f'{self.name} watchdog: no progress for {time.monotonic() - since:.0f} s in {phase}{at} '
          f'(train.watchdog_seconds={self.seconds:g}); process {self.process} exits with status '
          f'{EXIT_CODE}; its threads:', file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(EXIT_CODE)  # the main thread may be blocked inside XLA: no clean shutdown

