"""The seam through which procedures on trained models (depthscale.posthoc) reach a rung's
training without the loop knowing them.

A procedure registers the fields of the config's posthoc section it reads and its hooks: a
check (before anything is written), a start that replaces the initial parameters, a
transform of the train state before each step's update, and fields for summary.json.
train_rung runs the hooks of every procedure whose switch field is set. A config that sets
a field of the section that no registered procedure reads is a ConfigError: the run never
trains silently without the procedure it asks for (`import depthscale.posthoc` registers
the project's procedures; depthscale.experiment, and so the CLI, does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from depthscale.config import ConfigDict, default_config
from depthscale.errors import ConfigError

SECTION = 'posthoc'  # the config section whose fields belong to registered procedures


@dataclasses.dataclass(frozen=True)
class Start:
  """What a start hook returns."""
  params: Any  # the start parameters, host arrays or any placement (the run places them)
  summary: dict  # fields for summary.json
  line: str  # printed by process 0 before training


@dataclasses.dataclass(frozen=True)
class Procedure:
  """One procedure's fields and hooks; `checked` is what its check returned."""
  name: str
  switch: str  # the field of SECTION that turns it on (set: not its default value)
  fields: tuple[str, ...]  # every field of SECTION it reads, the switch included
  check: Callable[[ConfigDict, str], Any]  # (cfg, workdir) -> checked; raises ConfigError
  start: Callable[..., Start] | None = None  # (cfg, checked, workdir, sharding, fresh params)
  transform: Callable[..., Callable[[dict, int, dict], dict]] | None = None
  # ^ (cfg, model, params) -> fn(state, step, batch) -> state, run before each step's update
  summary: Callable[[Any], dict] | None = None  # final params -> fields for summary.json


_REGISTERED: dict[str, Procedure] = {}


def register(procedure: Procedure) -> Procedure:
  """Adds a procedure (again under the same name: replaces it)."""
  _REGISTERED[procedure.name] = procedure
  return procedure


def active(cfg: ConfigDict) -> list[Procedure]:
  """The registered procedures cfg switches on, in registration order; raises ConfigError
  for a set field of SECTION that no registered procedure reads."""
  defaults = default_config()[SECTION]
  on = {k for k, v in cfg[SECTION].items() if v != defaults.get(k)}
  read = {f for p in _REGISTERED.values() for f in p.fields}
  unread = sorted(on - read)
  if unread:
    field = unread[0]
    raise ConfigError(
        f'{SECTION}.{field}={cfg[SECTION][field]!r} is invalid: allowed {defaults[field]!r} '
        f'unless a registered procedure reads it (registered: {", ".join(_REGISTERED) or "none"};'
        ' `import depthscale.posthoc` registers the post-hoc procedures)')
  return [p for p in _REGISTERED.values() if p.switch in on]


class Hooks:
  """The active procedures of one run and what their checks returned."""

  def __init__(self, cfg: ConfigDict, workdir: str):
    self.checked = [(p, p.check(cfg, workdir)) for p in active(cfg)]
    self.summary: dict = {}
    self.transforms: list[Callable[[dict, int, dict], dict]] = []

  def start(self, cfg: ConfigDict, workdir: str, sharding, params) -> tuple[Any, list[str]]:
    """(start parameters, lines to print): params replaced by each start hook in turn (one
    line each; no line: params as given)."""
    lines = []
    for p, checked in self.checked:
      if p.start:
        s = p.start(cfg, checked, workdir, sharding, params)
        params = s.params
        self.summary.update(s.summary)
        lines.append(s.line)
    return params, lines

  def prepare(self, cfg: ConfigDict, model, params) -> None:
    """Builds the per-step transforms for parameters of this structure."""
    self.transforms = [p.transform(cfg, model, params) for p, _ in self.checked if p.transform]

  def before_step(self, state: dict, step: int, batch: dict) -> dict:
    for transform in self.transforms:
      state = transform(state, step, batch)
    return state

  def final(self, params) -> dict:
    """The summary fields: the start hooks' and each procedure's of the final parameters."""
    out = dict(self.summary)
    for p, _ in self.checked:
      if p.summary:
        out.update(p.summary(params))
    return out
