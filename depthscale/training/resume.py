"""Resuming a rung: the new config against the checkpointed one (config.json and the
history of its changes), and the final values of a rung whose last checkpoint is its end."""

from __future__ import annotations

import datetime
import json
import sys

from depthscale import storage
from depthscale.config import flatten
from depthscale.errors import ConfigError

CONFIG, HISTORY = 'config.json', 'config_history.jsonl'
# Fields that change neither the computed function nor the data order: cadence of logs,
# evals, checkpoints and analyses, what is recorded, where arrays live, input threads, the
# CPU dot library (the same function to float32 rounding), and a rung's resources on a cluster.
FREE_FIELDS = ('train.log_every', 'train.eval_every', 'train.checkpoint_every',
               'train.keep_checkpoints', 'data.read_threads', 'data.prefetch',
               'train.cpu_options')
FREE_SECTIONS = ('metrics.', 'mesh.', 'launch.')
ABSENT = '<absent>'


def diff(old: dict, new: dict) -> dict[str, tuple]:
  """Dotted field -> (old value, new value) for every field that differs; a field one side
  lacks shows as ABSENT there."""
  a, b = flatten(old), flatten(new)
  return {k: (a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(a.keys() | b.keys())
          if a.get(k, ABSENT) != b.get(k, ABSENT)}


def is_free(field: str, old, new) -> bool:
  """True if changing the field on resume keeps the computed function and the data order
  (train.steps counts as free: it moves the schedule's horizon, which the warning says;
  a field only one side has is one the code added or removed, taken to keep the function)."""
  return (field in FREE_FIELDS or field.startswith(FREE_SECTIONS) or field == 'train.steps'
          or ABSENT in (old, new))


def _describe(changes: dict[str, tuple]) -> str:
  return ', '.join(f'{k} {old!r} -> {new!r}' for k, (old, new) in changes.items())


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the checkpoint directories in workdir (finished or not, readable or not)."""
  return sorted(int(n) for n in storage.listdir(storage.join(workdir, 'checkpoints'))
                if n.isdigit())


def check_config(cfg, workdir: str, allow_config_change: bool = False) -> dict[str, tuple]:
  """The changes of cfg against the config.json of a rung with progress (a checkpoint or a
  summary); raises ConfigError if one changes the computed function or the data order
  (unless allow_config_change) or if train.steps falls below the latest checkpoint; prints
  a one-line warning listing the allowed ones. Writes nothing."""
  path = storage.join(workdir, CONFIG)
  steps = checkpoint_steps(workdir)
  finished = storage.exists(storage.join(workdir, 'summary.json'))
  if not storage.exists(path) or not (steps or finished):
    return {}
  changes = diff(storage.read_json(path), json.loads(cfg.to_json_best_effort()))
  if steps and cfg.train.steps < steps[-1]:
    raise ConfigError(f'train.steps={cfg.train.steps} is invalid: allowed >= {steps[-1]}, the '
                      f'step of the latest checkpoint in {workdir}')
  refused = {k: v for k, v in changes.items() if not is_free(k, *v)}
  if refused and not allow_config_change:
    raise ConfigError(f'{", ".join(refused)} changed since the checkpointed {path} '
                      f'({_describe(refused)}): allowed only with --allow_config_change (these '
                      'fields change the computed function or the data order), or a new --workdir')
  if changes:
    notes = []
    if 'train.steps' in changes:
      notes.append(f'the lr schedule\'s horizon moves to step {cfg.train.steps}')
    if refused:
      notes.append('--allow_config_change: the rung mixes two configs')
    print(f'warning: {workdir} resumes with a changed config: {_describe(changes)}'
          + (f' ({"; ".join(notes)})' if notes else ''), file=sys.stderr, flush=True)
  return changes


def write_config(cfg, workdir: str, changes: dict[str, tuple], step: int) -> None:
  """config.json (atomically) and, if it changed on resume, one config_history.jsonl
  record: the step it applies from and each field's old and new value."""
  if changes:
    record = {'step': step, 'time': datetime.datetime.now(datetime.timezone.utc).isoformat(),
              'changes': {k: list(v) for k, v in changes.items()},
              'refused_fields_allowed': [k for k, v in changes.items() if not is_free(k, *v)]}
    path = storage.join(workdir, HISTORY)
    kept = storage.read_jsonl(path)
    storage.write_text(path, ''.join(json.dumps(r) + '\n' for r in kept + [record]))
  storage.write_text(storage.join(workdir, CONFIG), cfg.to_json_best_effort(indent=2))


def final_logged(workdir: str, steps: int) -> tuple[float, dict[str, float]]:
  """(train loss, analysis scalars) of the final step steps - 1 from a rung's logs, for a
  rung restored at its final checkpoint (they were computed from the parameters before
  the last update, which the checkpoint no longer holds)."""
  path = storage.join(workdir, 'train_log.jsonl')
  last = [r for r in storage.read_jsonl(path) if r['step'] == steps - 1]
  if not last:
    raise ConfigError(f'{path} is invalid: allowed a train log holding the final step '
                      f'{steps - 1} (the checkpoint at step {steps} was saved after it)')
  path = storage.join(workdir, 'analysis_log.jsonl')
  analyses = [r for r in storage.read_jsonl(path) if r['step'] == steps - 1]
  scalars = {k: v for k, v in analyses[-1].items() if k != 'step'} if analyses else {}
  return last[-1]['train/loss'], scalars


def logged_tokens_per_sec(workdir: str, tokens_per_step: int) -> float:
  """Steady-state throughput from train_log.jsonl's perf/step_ms (the first logged interval,
  which holds the first step's dispatch, left out), for runs that timed no interval."""
  records = storage.read_jsonl(storage.join(workdir, 'train_log.jsonl'))
  pairs = [(b['step'] - a['step'], b.get('perf/step_ms', 0.0))
           for a, b in zip(records, records[1:])]
  pairs = [(n, ms) for n, ms in pairs if n > 0 and ms > 0]
  seconds = sum(n * ms / 1e3 for n, ms in pairs)
  return sum(n for n, _ in pairs) * tokens_per_step / seconds if seconds else float('nan')
