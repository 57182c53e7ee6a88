"""The rungs of one process share their compiled programs.

JAX keeps what it traced, lowered and compiled in memory, keyed on the functions it was given
(their identity, and the value of static arguments). A rung that takes its models, optimizer,
schedule, plan and step functions from `kept`, instead of building new ones, reuses every
program an earlier rung of the same process built for a config equal to its own but for
STEP_ARGUMENTS: the next rate or seed of a sweep, a rerun or a resume trace, lower and compile
nothing again (depthscale.main and notebooks run a ladder's rungs in one process). Processes
share compiled programs through JAX's persistent cache (depthscale.program_cache)."""

from __future__ import annotations

import collections
from typing import Callable, Hashable, TypeVar

from depthscale.config import key_without
from depthscale.model import ops

# Values the compiled programs take as arguments, not constants: rungs that differ only here
# run the same programs.
STEP_ARGUMENTS = (('optim', 'lr'), ('train', 'seed'))
KEEP = 16  # the objects kept: the least recently used goes first

T = TypeVar('T')
_KEPT: collections.OrderedDict = collections.OrderedDict()


def program_key(cfg) -> str:
  """Equal for the configs of rungs that run the same compiled programs."""
  return key_without(cfg, STEP_ARGUMENTS)


def kept(cfg, name: Hashable, build: Callable[[], T]) -> T:
  """What build() returned under `name` for the first config of this process with cfg's
  program key, on the same platform (built now if none is kept)."""
  key = (program_key(cfg), ops.platform_of(), name)
  if key in _KEPT:
    _KEPT.move_to_end(key)
    return _KEPT[key]
  value = _KEPT[key] = build()
  while len(_KEPT) > KEEP:
    _KEPT.popitem(last=False)
  return value


def clear() -> None:
  """Forgets every kept object: the next rung builds its programs as a new process would."""
  _KEPT.clear()
