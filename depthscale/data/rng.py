"""Portable randomness: string seeds and `Random.random()` only.

Python guarantees that `random.Random(str)` (sha512 seeding) and its
`random()` stream never change across versions and machines, so every
synthetic token depends only on its seeds.
"""

from __future__ import annotations

import random


def make(*key: object) -> random.Random:
  """A generator seeded by the ':'-joined key, e.g. make(seed, 'khop', i)."""
  return random.Random(':'.join(map(str, key)))


def below(r: random.Random, n: int) -> int:
  """Uniform int in [0, n)."""
  return int(r.random() * n)


def permutation(r: random.Random, n: int) -> list[int]:
  """Uniform permutation of range(n) (Fisher-Yates)."""
  p = list(range(n))
  for i in range(n - 1, 0, -1):
    j = below(r, i + 1)
    p[i], p[j] = p[j], p[i]
  return p
