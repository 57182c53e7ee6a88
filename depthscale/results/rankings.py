"""The variants of a ladder ranked by eval loss part-way through training and at the end:
does the order at 50% of the steps already hold at 100%?"""

from __future__ import annotations

import dataclasses

import pandas as pd

from depthscale.results import intervals

EVAL_LOSS = 'eval/loss'
FRACTIONS = (0.5, 1.0)


def eval_at(configs: pd.DataFrame, scalars: pd.DataFrame, fraction: float) -> pd.DataFrame:
  """Per rung with an eval logged: the eval logged nearest to `fraction` of its train.steps
  (the earlier of two equally near): rung, step, loss."""
  steps = configs.set_index('rung')['train.steps']
  evals = scalars[scalars.tag == EVAL_LOSS]
  near = (evals.step - fraction * evals.rung.map(steps)).abs()
  pick = near.groupby(evals.rung).idxmin()
  return evals.loc[pick.to_numpy(), ['rung', 'step', 'value']].rename(columns={'value': 'loss'})


@dataclasses.dataclass(frozen=True)
class Ranking:
  """table: per variant (index; rung names less their seed part), seeds, and per fraction f
  of the steps 'step@f' (the eval step picked, the first seed's), 'loss@f' (mean over seeds)
  and 'rank@f' (1: lowest loss). orders: fraction -> the variants, lowest loss first."""
  table: pd.DataFrame
  orders: dict[float, list[str]]

  @property
  def stable(self) -> bool:
    """The order of the variants is the same at every fraction."""
    return len({tuple(o) for o in self.orders.values()}) <= 1

  def describe(self) -> str:
    """One line per fraction ('50% of the steps: a < b'), then 'stable' or 'changed'."""
    lines = [f'{f:.0%} of the steps: ' + ' < '.join(o) for f, o in self.orders.items()]
    return '\n'.join(lines + ['stable' if self.stable else 'changed'])


def ranking(configs: pd.DataFrame, summaries: pd.DataFrame, scalars: pd.DataFrame,
            fractions: tuple[float, ...] = FRACTIONS) -> Ranking:
  """The finished rungs' variants ranked by mean eval loss over seeds at each fraction of
  the steps (eval_at; a ladder evaluated only at the end ranks its final losses at every
  fraction). From Results.configs, .summaries and .scalars."""
  if not fractions or not all(0 < f <= 1 for f in fractions):
    raise ValueError(f'fractions={fractions}: allowed one or more numbers in (0, 1]')
  done = scalars[scalars.rung.isin(summaries.rung)]
  table, orders = pd.DataFrame(), {}
  for f in fractions:
    at = eval_at(configs, done, f)
    by = at.groupby(at.rung.map(intervals.variant), sort=False)
    table['seeds'] = by.size()
    table[f'step@{f:.0%}'] = by.step.first()
    table[f'loss@{f:.0%}'] = by.loss.mean()
    table[f'rank@{f:.0%}'] = table[f'loss@{f:.0%}'].rank(method='min').astype(int)
    orders[f] = list(table[f'loss@{f:.0%}'].sort_values(kind='stable').index)
  table.index.name = 'variant'
  return Ranking(table, orders)
