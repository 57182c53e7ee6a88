"""Stage 2 of a learning-rate sweep (ladder.lr_sweep): the best rate among the finished
stage-1 rungs of a ladder directory, chosen when a stage-2 rung starts and recorded in its
best_lr.json; a diverged stage-1 rung is recorded in its diverged.json and counts as worst."""

from __future__ import annotations

import math

from depthscale import storage
from depthscale.errors import ConfigError

CHOICE_FILE = 'best_lr.json'  # in a stage-2 rung: {'lr', 'from', 'losses' (null: diverged)}
DIVERGED_FILE = 'diverged.json'  # in a stage-1 rung that went non-finite: {'error'}


def final_loss(rung_dir: str) -> float | None:
  """A rung's final eval loss; inf if it diverged or ended non-finite; None if unfinished."""
  if storage.exists(storage.join(rung_dir, DIVERGED_FILE)):
    return math.inf
  summary = storage.join(rung_dir, 'summary.json')
  if not storage.exists(summary):
    return None
  loss = storage.read_json(summary).get('final_eval_loss')
  return float(loss) if loss is not None and math.isfinite(loss) else math.inf


def best(losses: dict[str, float]) -> str:
  """The key of the lowest loss (the first one on ties); a non-finite loss counts as worst."""
  return min(losses, key=lambda k: losses[k] if math.isfinite(losses[k]) else math.inf)


def unfinished(workdir: str, rungs: tuple[str, ...]) -> list[str]:
  """Those of the rungs with no summary.json and no diverged.json in workdir."""
  return [r for r in rungs if final_loss(storage.join(workdir, r)) is None]


def choose(workdir: str, rung: str, sweep: tuple[str, ...]) -> float:
  """The learning rate of the best finished stage-1 rung of `sweep`, written with every
  stage-1 loss to workdir/rung/best_lr.json. Raises ConfigError if a stage-1 rung is
  unfinished or every one diverged."""
  missing = unfinished(workdir, sweep)
  if missing:
    raise ConfigError(f'rung {rung} needs its finished learning-rate sweep: '
                      f'{", ".join(missing)} not finished in {workdir}')
  losses = {r: final_loss(storage.join(workdir, r)) for r in sweep}
  winner = best(losses)
  if not math.isfinite(losses[winner]):
    raise ConfigError(f'rung {rung}: every rate of its sweep diverged ({", ".join(sweep)})')
  lr = storage.read_json(storage.join(workdir, winner, 'config.json'))['optim']['lr']
  storage.makedirs(storage.join(workdir, rung))
  storage.write_json(storage.join(workdir, rung, CHOICE_FILE),
                     {'lr': lr, 'from': winner,
                      'losses': {r: v if math.isfinite(v) else None for r, v in losses.items()}},
                     indent=2)
  return lr


def record_divergence(rung_dir: str, error: str) -> None:
  """Marks a stage-1 rung as diverged (resumes skip it; it counts as the worst rate)."""
  storage.write_json(storage.join(rung_dir, DIVERGED_FILE), {'error': error}, indent=2)
