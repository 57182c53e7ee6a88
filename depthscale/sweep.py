"""The rates of a learning-rate sweep (ladder.lr_sweep) decided when a rung starts, from the
finished stage-1 rungs of its ladder directory: a stage-2 rung trains at the best one, or
the second best (its lr_rank), recorded in its best_lr.json; an extension rung past the edge of the grid where the best
one is at that edge (recorded in its lr_extension.json, which says too when it is not
needed). A diverged stage-1 rung is recorded in its diverged.json and counts as worst."""

from __future__ import annotations

import math

from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.ladder import Extension

CHOICE_FILE = 'best_lr.json'  # in a stage-2 rung: {'lr', 'from', 'rank', 'losses' (null: diverged)}
# in an extension rung: {'needed', 'lr' (null: not needed), 'from' (the best rung), 'losses'}
EXTENSION_FILE = 'lr_extension.json'
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


def not_needed(rung_dir: str) -> bool:
  """Whether the rung is an extension that found the best rate inside its sweep."""
  path = storage.join(rung_dir, EXTENSION_FILE)
  return storage.exists(path) and not storage.read_json(path)['needed']


def ranked(losses: dict[str, float]) -> list[str]:
  """The keys from the lowest loss up (the first one on ties); non-finite losses last."""
  return sorted(losses, key=lambda k: losses[k] if math.isfinite(losses[k]) else math.inf)


def best(losses: dict[str, float]) -> str:
  """The key of the lowest loss (the first one on ties); a non-finite loss counts as worst."""
  return ranked(losses)[0]


def unfinished(workdir: str, rungs: tuple[str, ...]) -> list[str]:
  """Those of the rungs with no summary.json and no diverged.json in workdir, not-needed
  extensions left out."""
  return [r for r in rungs if final_loss(storage.join(workdir, r)) is None
          and not not_needed(storage.join(workdir, r))]


def measured(workdir: str, rung: str, sweep: tuple[str, ...]) -> dict[str, float]:
  """The final loss of each rung of `sweep` that trained (not-needed extensions left out).
  Raises ConfigError if one is unfinished."""
  missing = unfinished(workdir, sweep)
  if missing:
    raise ConfigError(f'rung {rung} needs its finished learning-rate sweep: '
                      f'{", ".join(missing)} not finished in {workdir}')
  return {r: final_loss(storage.join(workdir, r)) for r in sweep
          if not not_needed(storage.join(workdir, r))}


def rate(workdir: str, rung: str) -> float:
  """The optim.lr that a rung of workdir trained at."""
  return storage.read_json(storage.join(workdir, rung, 'config.json'))['optim']['lr']


def record(workdir: str, rung: str, file: str, choice: dict, losses: dict[str, float]) -> None:
  """Writes workdir/rung/file: the choice and every loss it saw (null: diverged)."""
  storage.makedirs(storage.join(workdir, rung))
  storage.write_json(storage.join(workdir, rung, file),
                     {**choice, 'losses': {r: v if math.isfinite(v) else None
                                           for r, v in losses.items()}}, indent=2)


def choose(workdir: str, rung: str, sweep: tuple[str, ...], rank: int = 1) -> float:
  """The learning rate of the rank-th best finished stage-1 rung of `sweep` (1: the best),
  written with the rank and every stage-1 loss to workdir/rung/best_lr.json. Raises
  ConfigError if a stage-1 rung is unfinished or fewer than `rank` of them stayed finite."""
  losses = measured(workdir, rung, sweep)
  finite = [r for r in ranked(losses) if math.isfinite(losses[r])]
  if len(finite) < rank:
    raise ConfigError(f'rung {rung}: {len(finite)} rates of its sweep stayed finite, it trains '
                      f'at the rank {rank} one ({", ".join(sweep)})')
  winner = finite[rank - 1]
  lr = rate(workdir, winner)
  record(workdir, rung, CHOICE_FILE, {'lr': lr, 'from': winner, 'rank': rank}, losses)
  return lr


def extend(workdir: str, rung: str, extension: Extension) -> float | None:
  """The rate of an extension rung: the highest rate of the finished stage-1 rungs
  extension.after times extension.up where the best of them has it, their lowest divided by
  extension.down where the best has that one (or every one diverged), else None (not
  needed). Written with every loss to workdir/rung/lr_extension.json on the first call,
  read back from it on later ones. Raises ConfigError if a rung of `after` is unfinished."""
  path = storage.join(workdir, rung, EXTENSION_FILE)
  if storage.exists(path):
    return storage.read_json(path)['lr']
  losses = measured(workdir, rung, extension.after)
  rates = {r: rate(workdir, r) for r in losses}
  winner = best(losses)
  if not math.isfinite(losses[winner]):
    winner = min(rates, key=rates.get)
  lr = (rates[winner] * extension.up if rates[winner] == max(rates.values()) else
        rates[winner] / extension.down if rates[winner] == min(rates.values()) else None)
  record(workdir, rung, EXTENSION_FILE, {'needed': lr is not None, 'lr': lr, 'from': winner},
         losses)
  return lr


def record_divergence(rung_dir: str, error: str) -> None:
  """Marks a stage-1 rung as diverged (resumes skip it; it counts as the worst rate)."""
  storage.write_json(storage.join(rung_dir, DIVERGED_FILE), {'error': error}, indent=2)
