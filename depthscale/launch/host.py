"""What runs on a node for a rung: one `python -m depthscale.main` process (one per host of a
gang), its output streamed to the launcher's monitor, stopped with SIGTERM when the launcher
cancels the task (the rung checkpoints and exits) and killed with its parent when the node,
the Ray worker or the launcher's job dies, so a rung never has two writers."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
POLL_S = 1.0  # how often a gang host asks for its coordinator
FLUSH_S = 0.5  # how often its output lines go to the monitor
STOP_GRACE_S = 60.0  # after SIGTERM, the process's time to checkpoint before SIGKILL


def _die_with_parent() -> None:
  """In the child, before exec: SIGKILL when the thread that started it dies (Linux)."""
  try:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  except (AttributeError, OSError):
    pass


def free_port() -> int:
  """A TCP port free on this host now (the gang's jax.distributed coordinator)."""
  with socket.socket() as s:
    s.bind(('', 0))
    return s.getsockname()[1]


def node_ip() -> str:
  import ray  # pylint: disable=import-outside-toplevel
  return ray.util.get_node_ip_address()


def node_id() -> str:
  import ray  # pylint: disable=import-outside-toplevel
  return ray.get_runtime_context().get_node_id()


def signal_rung(pid: int, rung: str, signum: int) -> bool:
  """On the rung's node: `signum` to process `pid` if it is still that rung's (its command
  line names the rung; Linux's /proc). The launcher's stop, independent of ray.cancel."""
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      if f'--rung={rung}'.encode() not in f.read().split(b'\0'):
        return False
    os.kill(pid, signum)
  except OSError:
    return False
  return True


class _Lines:
  """The process's output, read on a thread, sent to the monitor in batches."""

  def __init__(self, proc: subprocess.Popen, send):
    self._proc, self._send, self._buf, self._lock = proc, send, [], threading.Lock()
    self._thread = threading.Thread(target=self._read, daemon=True)
    self._thread.start()

  def _read(self) -> None:
    for line in self._proc.stdout:
      with self._lock:
        self._buf.append(line.rstrip('\n'))

  def flush(self, final: bool = False) -> None:
    if final:
      self._thread.join(timeout=10)
    with self._lock:
      lines, self._buf = self._buf, []
    if lines:
      self._send(lines)


def run(argv: list[str], env: dict[str, str], cwd: str | None, monitor, key: tuple) -> int:
  """Runs argv (a rung's process) to its end and returns its exit code (negative: the signal
  that killed it). `monitor` (monitor.Monitor) receives its start (node and pid) and its output
  lines. ray.cancel of this task (a KeyboardInterrupt here) sends the process SIGTERM, so it
  checkpoints and exits, then SIGKILL after STOP_GRACE_S; the launcher also signals the
  process itself (signal_rung). Nothing here waits on Ray: a task blocked in ray.get would
  lend its CPUs to another rung."""
  full_env = {**os.environ, **env, 'PYTHONUNBUFFERED': '1'}
  proc = subprocess.Popen(  # pylint: disable=consider-using-with
      argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env,
      cwd=cwd if cwd and os.path.isdir(cwd) else None, preexec_fn=_die_with_parent)
  monitor.started.remote(key, node_ip(), node_id(), proc.pid)
  lines = _Lines(proc, lambda batch: monitor.lines.remote(key, batch))
  term_at = None
  while True:
    try:  # the poll too: a cancel that lands there must not leave the process running
      if proc.poll() is not None:
        break
      time.sleep(FLUSH_S)
      lines.flush()
      if term_at is not None and time.monotonic() - term_at > STOP_GRACE_S:
        proc.kill()
    except KeyboardInterrupt:  # ray.cancel: stop the rung at its next step, checkpointed
      if term_at is None:
        proc.send_signal(signal.SIGTERM)
        term_at = time.monotonic()
  lines.flush(final=True)
  return proc.returncode


def python() -> str:
  """The interpreter of this worker (the cluster's environment)."""
  return sys.executable


COORDINATOR_WAIT_S = 600.0  # a gang host's wait for host 0 to publish the coordinator


def run_gang_host(argv: list[str], env: dict[str, str], cwd: str | None, monitor, key: tuple,
                  hosts: int) -> int:
  """Host key[2] of a gang of `hosts` JAX processes: host 0 publishes its address and a free
  port as the jax.distributed coordinator, the others wait for it; then run()."""
  import ray  # pylint: disable=import-outside-toplevel
  rung, attempt, index = key
  if index == 0:
    address = f'{node_ip()}:{free_port()}'
    ray.get(monitor.set_coordinator.remote((rung, attempt), address))
  else:
    deadline = time.monotonic() + COORDINATOR_WAIT_S
    while (address := ray.get(monitor.coordinator.remote((rung, attempt)))) is None:
      if time.monotonic() > deadline:
        print(f'error: host 0 of rung {rung} published no coordinator in '
              f'{COORDINATOR_WAIT_S:.0f} s', file=sys.stderr)
        return 1
      time.sleep(POLL_S)
  return run(argv + [f'--coordinator_address={address}', f'--num_processes={hosts}',
                     f'--process_id={index}'], env, cwd, monitor, key)
