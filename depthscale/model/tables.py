"""What the method tables (norms, residual designs, inits) share: finding the rows that
state a fact, for the allowed values an error names."""

from __future__ import annotations


def rows_with(table: dict, fact: str) -> list[str]:
  """The names of the table's rows whose `fact` is true, in table order."""
  return [name for name, row in table.items() if getattr(row, fact)]
