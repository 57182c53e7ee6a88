"""Ladders: explicit tables of rungs (name -> config overrides) and helpers for the
usual shapes (depth sweep at fixed width; width-depth sweep at a fixed budget)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any


@dataclasses.dataclass(frozen=True)
class Rung:
  """One run of a ladder: its directory name and the config fields it overrides."""
  name: str
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  info: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. the achieved budget


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


def cross(variants: dict[str, dict[str, Any]], rungs: list[Rung]) -> list[Rung]:
  """Every variant (name -> overrides) on every rung, named '<variant>_<rung>'."""
  return [Rung(f'{v}_{r.name}', {**r.overrides, **o}, r.info)
          for (v, o), r in itertools.product(variants.items(), rungs)]
