"""The launcher's loop: start every rung whose needs have ended as soon as the cluster holds
it, follow each through its hosts' reports (one line per state change, step and ETA from its
log), retry the ones whose node went away or whose process was killed, and stop them all
(checkpointed) on SIGINT / SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import time

from depthscale import storage
from depthscale.launch import attempt as attempts
from depthscale.launch.monitor import Monitor
from depthscale.launch.plan import Task, done
from depthscale.training import resume

STEP = re.compile(r' step\s+(\d+)/(\d+) .*\| ETA (.+)$')
ERROR = re.compile(r'^error: (.+)$')
PROGRESS_EVERY_S = 10.0  # at most one step line per rung this often
GANG_GRACE_S = 30.0  # a failed host's gang: the others end (and log) by themselves or are killed
LOG = 'launch.log'  # in each rung's directory: the output of every attempt
ENDED = ('finished', 'failed', 'stopped')


@dataclasses.dataclass
class RungState:
  """A rung's state in the launcher."""
  task: Task
  state: str = 'waiting'  # waiting, queued, running, then one of ENDED
  attempts: int = 0
  why: str = ''  # the last retry's or the failure's reason
  node: str = ''
  last_progress: float = 0.0
  error: str = ''  # the last 'error: ...' line of the current attempt
  log: storage.Appender | None = None
  current: attempts.Attempt | None = None


class Launcher:
  """Runs tasks (in the ladder's order) with depthscale.main's flags `argv` (less --rung) on
  the connected cluster; `run` returns when every rung has ended. Needs outside `tasks` have
  ended before (experiment.prepare checks)."""

  def __init__(self, ray, tasks: list[Task], workdir: str, argv: list[str], out=print):
    self.ray, self.workdir, self.argv, self.out = ray, workdir, argv, out
    self.rungs = {t.name: RungState(t) for t in tasks}
    self.stopping = 0  # signals received
    self._cancelled = 0  # signals passed on to the running rungs
    self.monitor = ray.remote(num_cpus=0, max_restarts=0)(Monitor).options(
        name=f'depthscale-launch-{os.getpid()}', scheduling_strategy=_this_node(ray)).remote()

  def summary(self) -> str:
    counts = {s: sum(r.state == s for r in self.rungs.values())
              for s in ('finished', 'running', 'queued', 'waiting', 'failed', 'stopped')}
    return '[' + ', '.join([f'{counts["finished"]}/{len(self.rungs)} finished'] + [
        f'{n} {s}' for s, n in counts.items() if s != 'finished' and n]) + ']'


  def say(self, rung: RungState, text: str) -> None:
    line = f'{rung.task.name}: {text}'
    self.out(f'{self.summary()} {line}')
    if rung.log is not None:
      rung.log.write(f'[launch] {line}\n'.encode())

  def _open_log(self, rung: RungState) -> None:
    rung_dir = storage.join(self.workdir, rung.task.name)
    storage.makedirs(rung_dir)
    path = storage.join(rung_dir, LOG)
    rung.log = storage.Appender(path, storage.read_bytes(path) if storage.exists(path) else b'')

  def run(self) -> dict[str, RungState]:
    old = {s: signal.signal(s, self._signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      for r in self.rungs.values():
        ended = done(self.workdir, r.task.name, r.task.steps)
        if ended:
          r.state, r.why = 'finished', f'{ended} before this launch'
          self.say(r, r.why)
      while any(r.state not in ENDED for r in self.rungs.values()):
        self._start_ready()
        self._collect()
        self._read_monitor()
    finally:
      for s, handler in old.items():
        signal.signal(s, handler)
      for r in self.rungs.values():
        if r.log is not None:
          r.log.close()
    return self.rungs

  def _signal(self, signum, _frame) -> None:
    self.stopping += 1
    print(f'launch: {signal.Signals(signum).name}: ' + (
        'the running rungs checkpoint and stop (again to kill them)' if self.stopping == 1
        else 'killing the running rungs'), file=sys.stderr, flush=True)

  def _start_ready(self) -> None:
    """Starts the waiting rungs whose needs have finished, by wave, then in the ladder's order:
    the first rung of each set that shares compiled programs goes before the second of any,
    so that rungs running at once compile different programs and the rest find theirs in
    the ladder's compilation cache (depthscale.program_cache)."""
    for r in sorted(self.rungs.values(), key=lambda r: r.task.wave):
      if r.state != 'waiting':
        continue
      if self.stopping:
        r.state, r.why = 'stopped', 'not started'
        self.say(r, 'stopped before it started')
        continue
      needs = [self.rungs.get(n) for n in r.task.needs]
      failed = [n for n, d in zip(r.task.needs, needs) if d and d.state in ('failed', 'stopped')]
      if failed:
        r.state, r.why = 'failed', f'needs {", ".join(failed)}, which did not finish'
        self.say(r, r.why)
      elif all(d is None or d.state == 'finished' for d in needs):  # others ended before
        self._start(r)

  def _start(self, r: RungState) -> None:
    if r.log is None:
      self._open_log(r)
    r.attempts += 1
    r.state, r.error, r.node = 'queued', '', ''
    argv = self.argv + [f'--rung={r.task.name}']
    r.current = attempts.start(self.ray, r.task, r.attempts, argv, os.getcwd(), self.monitor)
    self.say(r, f'queued ({r.task.resources})' + (f', attempt {r.attempts}' if r.attempts > 1 else ''))

  def _collect(self) -> None:
    """Waits up to a second for a host to end, then settles every attempt whose hosts have
    all ended, or one of which failed GANG_GRACE_S ago (its other hosts, which would wait for
    it forever, are then killed)."""
    refs = [ref for r in self.rungs.values() if r.current for ref in r.current.refs]
    if not refs:
      time.sleep(0.2)
      return
    if self.stopping > self._cancelled:  # a signal since the last pass: pass it on
      self._cancelled = self.stopping
      for r in self.rungs.values():
        if r.current:
          r.current.stop(self.ray, force=self.stopping > 1)
    ended, _ = self.ray.wait(refs, num_returns=len(refs), timeout=1.0)
    ended = set(ended)
    for r in self.rungs.values():
      if not r.current:
        continue
      results = [self._result(ref) for ref in r.current.refs if ref in ended]
      broken = [x for x in results if x != 0]
      if broken and len(results) < len(r.current.refs) and not self.stopping:
        r.current.failed_at = r.current.failed_at or time.monotonic()
        if time.monotonic() - r.current.failed_at < GANG_GRACE_S:
          continue
      if broken or len(results) == len(r.current.refs):
        self._read_monitor()  # the attempt's last lines first
        if len(results) < len(r.current.refs):
          r.current.release(self.ray, force=True)  # a gang's other hosts would wait forever
        else:
          r.current.release(self.ray)
        r.current = None
        self._settle(r, broken[0] if broken else 0)

  def _result(self, ref):
    """A host's exit code, or the Ray error that ended it (its node or worker died)."""
    try:
      return self.ray.get(ref)
    except self.ray.exceptions.RayError as e:
      return e

  def _settle(self, r: RungState, result) -> None:
    ended = done(self.workdir, r.task.name, r.task.steps)
    if ended:
      r.state, r.why = 'finished', f'retried after: {r.why}' if r.why else ''
      self.say(r, self._finished_text(r, ended))
      return
    if isinstance(result, int) and result in (attempts.BAD_INPUT, attempts.DIVERGED):
      r.state, r.why = 'failed', r.error or f'exit code {result}'
      self.say(r, f'failed: {r.why}')
      return
    if self.stopping:
      steps = resume.checkpoint_steps(storage.join(self.workdir, r.task.name))
      r.state = 'stopped'
      r.why = f'latest checkpoint at step {steps[-1]}' if steps else 'no checkpoint yet'
      self.say(r, f'stopped, {r.why} (the same command resumes it)')
      return
    if isinstance(result, Exception):
      why = f'its node or worker died ({type(result).__name__})'
    elif result == 0:
      why = 'its process was stopped (SIGTERM: a preemption) after a checkpoint'
    elif result < 0:
      why = f'its process was killed ({signal.Signals(-result).name})'
    else:
      why = f'exit code {result}' + (f': {r.error}' if r.error else '')
    if r.attempts > r.task.retries:
      r.state, r.why = 'failed', f'{why}; {r.task.retries} retries spent'
      self.say(r, f'failed: {r.why}')
      return
    r.why = why
    self.say(r, f'retrying ({r.attempts}/{r.task.retries}): {why}')
    self._start(r)

  def _finished_text(self, r: RungState, ended: str) -> str:
    if ended != 'finished':
      return ended
    summary = storage.read_json(storage.join(self.workdir, r.task.name, 'summary.json'))
    loss = summary.get('final_eval_loss')
    return f'finished, eval loss {loss:.4f}' if isinstance(loss, float) else 'finished'

  def _read_monitor(self) -> None:
    for event in self.ray.get(self.monitor.drain.remote()):
      kind, (name, number, index) = event[0], event[1]
      r = self.rungs[name]
      if number != r.attempts:
        continue  # a cancelled attempt's last words
      if kind == 'start':
        if r.current:
          r.current.processes[index] = event[3:]
          if self.stopping:  # started while the stop went out: stopped now
            r.current.signal(self.ray, index,
                             signal.SIGKILL if self.stopping > 1 else signal.SIGTERM)
        if r.state == 'queued':
          r.state, r.node = 'running', event[2]
          hosts = len(r.current.refs) if r.current else 1
          self.say(r, f'running on {r.node}' + (f' (host 0 of {hosts})' if hosts > 1 else ''))
        continue
      prefix = f'[host {index}] ' if r.current and len(r.current.refs) > 1 else ''
      r.log.write(''.join(f'{prefix}{line}\n' for line in event[2]).encode())
      for line in event[2] if index == 0 else ():  # a gang's hosts print the same steps
        self._progress(r, line)
    for r in self.rungs.values():
      if r.log is not None:
        r.log.flush()

  def _progress(self, r: RungState, line: str) -> None:
    if (m := ERROR.match(line)):
      r.error = m[1]
    elif (m := STEP.search(line)):
      step, now = int(m[1]) + 1, time.monotonic()
      if now - r.last_progress >= PROGRESS_EVERY_S or step == int(m[2]):
        r.last_progress = now
        self.say(r, f'step {step}/{m[2]}, ETA {m[3]}')


def _this_node(ray):
  """Scheduling on the launcher's own node (the monitor lives and dies with the launch)."""
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=import-outside-toplevel
  return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
