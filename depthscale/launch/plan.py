"""What the launcher schedules: each selected rung's needs and resources (the config's launch
section, after the rung's overrides) and what its directory already holds."""

from __future__ import annotations

import collections
import dataclasses

from depthscale import storage, sweep
from depthscale.ladder import Rung
from depthscale.training.programs import program_key


@dataclasses.dataclass(frozen=True)
class Task:
  """One rung as the launcher runs it."""
  name: str
  needs: tuple[str, ...]  # rungs that must have finished (in this ladder directory) first
  steps: int  # train.steps: a summary at this step means finished
  cpus: int
  hosts: int
  tpu: str
  gpus: int
  retries: int
  wave: int = 0  # the k-th rung (0-based) of those that run its compiled programs

  @property
  def resources(self) -> str:
    """The resources in words: '1 CPU', '2 hosts x 4 CPUs, 8 GPUs', 'TPU v5p-64'."""
    if self.tpu:
      return f'TPU {self.tpu}'
    one = f'{self.cpus} CPU{"s" if self.cpus > 1 else ""}' + (f', {self.gpus} GPUs' if self.gpus else '')
    return one if self.hosts == 1 else f'{self.hosts} hosts x {one}'


def tasks(resolved: list[tuple[Rung, object]]) -> list[Task]:
  """The launcher's tasks of resolved (rung, config) pairs, in the ladder's order; needs
  outside the selection stay (they must be finished on disk). A task's wave counts the
  rungs before it that run the same compiled programs (programs.program_key)."""
  out, seen = [], collections.Counter()
  for r, cfg in resolved:
    la, key = cfg.launch, program_key(cfg)
    out.append(Task(r.name, tuple(r.needs), cfg.train.steps, la.cpus, la.hosts, la.tpu, la.gpus,
                    la.retries, seen[key]))
    seen[key] += 1
  return out


def done(workdir: str, name: str, steps: int | None = None) -> str | None:
  """What a rung's directory says it ended as: 'finished' (a summary at `steps`, any step if
  None), 'diverged' (a learning-rate sweep's rung recorded as worst), 'not needed' (an
  extension past a grid whose best rate was inside it), or None (not ended)."""
  rung_dir = storage.join(workdir, name)
  if sweep.not_needed(rung_dir):
    return 'not needed'
  if storage.exists(storage.join(rung_dir, sweep.DIVERGED_FILE)):
    return 'diverged'
  path = storage.join(rung_dir, 'summary.json')
  if storage.exists(path) and (steps is None or storage.read_json(path).get('steps') == steps):
    return 'finished'
  return None

