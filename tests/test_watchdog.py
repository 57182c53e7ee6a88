"""The watchdog: a phase without progress past its limit names itself and exits non-zero;
progress, pauses and a clean exit keep the process alive; the limit is validated."""

import subprocess
import sys

import pytest

from depthscale.config import ConfigError, validate
from depthscale.training import watchdog
from tests.helpers import tiny_config

STUCK = """
import time
from depthscale.training.watchdog import Watchdog
with Watchdog(0.4, 'rung_a') as w:
  w.pause()
  time.sleep(1.0)  # paused (compiling): not watched
  for _ in range(10):  # progress every 0.1 s: alive
    w.enter('train step', 3)
    time.sleep(0.1)
  w.enter('eval', 7)
  time.sleep(60)  # stuck
"""

HEALTHY = """
import time
from depthscale.training.watchdog import Watchdog
with Watchdog(0.2, 'rung_b') as w:
  w.enter('checkpoint', 1)
print('left the block', flush=True)
time.sleep(0.6)  # past the limit after the block: the watchdog is gone
"""


def _python(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)


def test_stuck_phase_exits_nonzero_and_says_where():
  proc = _python(STUCK)
  assert proc.returncode == watchdog.EXIT_CODE, proc.stderr[-2000:]
  line = next(l for l in proc.stderr.splitlines() if 'watchdog' in l)
  assert line.startswith('rung_a watchdog: no progress for ') and 'in eval at step 7' in line
  assert 'train.watchdog_seconds=0.4' in line and f'status {watchdog.EXIT_CODE}' in line
  assert 'File "<string>", line 11 in <module>' in proc.stderr  # the main thread at sleep(60)


def test_progress_and_exit_keep_the_process_alive():
  proc = _python(HEALTHY)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout == 'left the block\n' and 'watchdog' not in proc.stderr


def test_watchdog_seconds_validated():
  validate(tiny_config(**{'train.watchdog_seconds': 0.0}))
  with pytest.raises(ConfigError, match=r"train.watchdog_seconds=-1.0 is invalid: allowed 0 \(off\)"):
    validate(tiny_config(**{'train.watchdog_seconds': -1.0}))
