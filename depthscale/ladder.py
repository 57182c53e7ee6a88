"""Ladders: explicit tables of rungs (name -> config overrides) and helpers for the
usual shapes (depth sweep at fixed width; width-depth sweep at a fixed budget; a
learning-rate sweep per variant, optionally extended past the edge of its grid, then seeds
at each variant's best rate)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Any

SEED = re.compile(r'_s(\d+)(?=_|$)')  # a rung name's seed part: '<variant>_s<k>[_<shape>]'


@dataclasses.dataclass(frozen=True)
class Extension:
  """A learning-rate sweep's rung past the edge of its grid (lr_sweep's extend): its rate is
  decided when it starts from the finished stage-1 rungs `after` (depthscale.sweep.extend)."""
  after: tuple[str, ...]  # the grid's rungs, then the earlier extensions
  up: float  # the grid's step above its highest rate: the ratio of its two highest
  down: float  # and below its lowest: the ratio of its two lowest


@dataclasses.dataclass(frozen=True)
class Rung:
  """One run of a ladder: its directory name and the config fields it overrides."""
  name: str
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the achieved budget
  # stage 2 of lr_sweep: trains at the optim.lr of the lr_rank-th best of these finished rungs
  best_lr_of: tuple[str, ...] = ()
  lr_rank: int = 1
  extension: Extension | None = None  # a stage-1 rung of lr_sweep past the edge of its grid

  @property
  def needs(self) -> tuple[str, ...]:
    """The rungs that must have finished before this one starts."""
    return self.best_lr_of + (self.extension.after if self.extension else ())


def block_params(d_model: int, num_layers: int, *, mlp_ratio: float = 4.0, mlp: str = 'gelu',
                 num_heads: int = 1, num_kv_heads: int = 0) -> int:
  """Non-embedding matrix parameters of the standard block stack (norm gains excluded)."""
  head_dim = d_model // num_heads
  kv = (num_kv_heads or num_heads) * head_dim
  attn = 2 * d_model * d_model + 2 * d_model * kv
  ff = (3 if mlp == 'swiglu' else 2) * d_model * int(round(mlp_ratio * d_model))
  return num_layers * (attn + ff)


def depth_sweep(depths: list[int], **fixed: Any) -> list[Rung]:
  """Rungs 'L<depth>' varying model.num_layers; `fixed` overrides go to every rung."""
  return [Rung(f'L{l}', {**fixed, 'model.num_layers': l}) for l in depths]


def budget_sweep(budget: int, depths: list[int], *, head_dim: int = 32,
                 mlp_ratio: float = 4.0, mlp: str = 'gelu', **fixed: Any) -> list[Rung]:
  """Width-depth rungs 'd<D>_L<L>' at a fixed non-embedding budget.

  For each depth, d_model is the multiple of head_dim whose block_params is closest to
  the budget; num_heads = d_model / head_dim. Each rung's info holds the achieved budget.
  """
  rungs = []
  for l in depths:
    per_unit = block_params(head_dim, l, mlp_ratio=mlp_ratio, mlp=mlp) / head_dim ** 2
    ideal = math.sqrt(budget / per_unit) / head_dim
    options = {max(1, math.floor(ideal)), max(1, math.ceil(ideal))}
    heads = min(options, key=lambda h: abs(
        block_params(h * head_dim, l, mlp_ratio=mlp_ratio, mlp=mlp, num_heads=h) - budget))
    d = heads * head_dim
    achieved = block_params(d, l, mlp_ratio=mlp_ratio, mlp=mlp, num_heads=heads)
    rungs.append(Rung(f'd{d}_L{l}', {**fixed, 'model.d_model': d, 'model.num_layers': l,
                                     'model.num_heads': heads, 'model.mlp_ratio': mlp_ratio,
                                     'model.mlp': mlp},
                      {'budget': budget, 'achieved': achieved,
                       'relative_error': achieved / budget - 1}))
  return rungs


def split_seed(name: str) -> tuple[str, int | None]:
  """'<variant>_s<k>[_<shape>]' -> (variant, k), seed and shape dropped; a name without a
  seed part -> (name, None)."""
  m = SEED.search(name)
  return (name[:m.start()], int(m[1])) if m else (name, None)


def cross(variants: dict[str, dict[str, Any]], rungs: list[Rung]) -> list[Rung]:
  """Every variant (name -> overrides) on every rung, named '<variant>_<rung>'."""
  return [Rung(f'{v}_{r.name}', {**r.overrides, **o}, r.info)
          for (v, o), r in itertools.product(variants.items(), rungs)]


def lr_name(rate: float) -> str:
  """A rate as a rung-name part: 3e-3 -> 'lr3e-3', 2.5e-4 -> 'lr2.5e-4'."""
  mantissa, exponent = f'{rate:.1e}'.split('e')
  return f'lr{mantissa.removesuffix(".0")}e{int(exponent)}'


def lr_sweep(variants: dict[str, dict[str, Any]], rates: list[float],
             seeds: int = 3, extend: int = 0, finalists: int = 1) -> list[Rung]:
  """A learning-rate sweep of each variant (name -> overrides), then seeds at its best rates.

  Stage 1: '<variant>_lr<rate>' (lr_name) at every rate, train.seed 0. Stage 2: the seeds
  k = 1..seeds at each of the `finalists` best stage-1 rates (lowest final eval loss first;
  a diverged run counts as worst): '<variant>_best_s<k>' at the best, '<variant>_top<j>_s<k>'
  at the j-th best (j >= 2). Each chooses its rate when it starts from the stage-1 results in
  the ladder directory and records it in its best_lr.json (depthscale.sweep). The variant's
  rate is then the finalist with the lowest mean over its seeds (results.intervals.finalist):
  a rate that wins on seed 0 alone does not decide. The stage-2 seeds are fresh (the
  stage-1 run is not one of them) and seed k sees the same batches in every variant, so
  variants pair by seed. Warmup and schedule stay as the config sets them.

  extend = K > 0 adds K stage-1 rungs '<variant>_lr_ext<k>' after the grid, each deciding
  its rate when it starts from the finished stage-1 rungs before it (depthscale.sweep.extend,
  recorded in its lr_extension.json): where the best of them is at the highest rate measured,
  it trains at that rate times the grid's step (the ratio of its two highest rates); at the
  lowest (or where every one diverged), at that rate divided by the step (of the two lowest);
  inside, it is not needed and trains nothing. A diverged extension counts as worst, so the
  ones after it are not needed. Stage 2 chooses among the extensions that trained too.
  """
  names = [lr_name(r) for r in rates]
  if len(rates) < 2 or len(set(names)) < len(rates) or min(rates) <= 0 or seeds < 1:
    raise ValueError(f'rates={rates}, seeds={seeds}: allowed >= 2 distinct positive rates '
                     f'(2 significant digits) and seeds >= 1')
  for field, value, low in (('extend', extend, 0), ('finalists', finalists, 1)):
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ValueError(f'{field}={value!r}: allowed an int >= {low}')
  if finalists > len(rates):
    raise ValueError(f'finalists={finalists}: allowed at most the {len(rates)} rates')
  grid = sorted(rates)
  rungs = []
  for v, o in variants.items():
    sweep = [Rung(f'{v}_{n}', {**o, 'optim.lr': r, 'train.seed': 0}) for n, r in zip(names, rates)]
    for k in range(1, extend + 1):
      sweep.append(Rung(f'{v}_lr_ext{k}', {**o, 'train.seed': 0}, extension=Extension(
          tuple(r.name for r in sweep), grid[-1] / grid[-2], grid[1] / grid[0])))
    rungs += sweep + [Rung(f'{v}_{finalist_name(j)}_s{k}', {**o, 'train.seed': k},
                           best_lr_of=tuple(r.name for r in sweep), lr_rank=j)
                      for j in range(1, finalists + 1) for k in range(1, seeds + 1)]
  return rungs


def finalist_name(rank: int) -> str:
  """The stage-2 name part of lr_sweep's rank-th best rate: 'best', then 'top2', 'top3'."""
  return 'best' if rank == 1 else f'top{rank}'
