"""`khop`: multi-hop variable binding, e.g. `v3 = 7 ; v9 = v3 ; ? v9 = 7 ;`.

An episode is a straight-line program of single assignments with queries
interleaved. Each query variable ends a fresh chain of k assignments
(`x1 = c ; x2 = x1 ; ... ; xk = x(k-1)`), k uniform in 1..khop_max, so
answering `? xk =` with `c` needs k dereferences. Distractor assignments bind
fresh variables to a value or to an already bound variable (branching off the
chains), and all assignments are shuffled in a random order that keeps every
variable bound before it is read; each query `? xk = c ;` is shuffled in too,
at a random point after its chain is complete. An episode ends with EOS.
Episodes are concatenated to fill a record (the last one is cut); every
record starts with a new episode, so each answer's whole chain is inside the
record. Cutting favours short chains: with seq_len 128 and the defaults about
1.8x as many k=1 as k=4 answers are labelled; seq_len near 4*khop_max leaves
few large-k answers.

Why depth should matter: one attention layer can move one binding one step,
so resolving k hops needs k sequential compositions; known constructions and
lower bounds put k-hop reasoning at depth ~log k (pointer doubling) to ~k for
transformers. Per-k accuracy at the answer positions (the target position of
each answer carries `hop = k`) shows at which k a model of a given depth
breaks. All positions keep LM weight 1: the random values and variable names
are irreducible noise shared by all models, and the per-k accuracy isolates
the reasoning signal.

Tokens: `= ; ?`, NUM_VARS variable names and NUM_VALUES values (see vocab).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from depthscale.data import rng
from depthscale.data import vocab


@dataclasses.dataclass(frozen=True)
class Spec:
  """Episode shape: hop range, queries and distractor assignments."""
  max_hops: int
  queries: int
  distractors: int

  @property
  def max_vars(self) -> int:
    return self.max_hops * self.queries + self.distractors

  @property
  def min_length(self) -> int:
    """Tokens of one longest chain, its query and EOS."""
    return 4 * self.max_hops + 6


def episode(r: random.Random, spec: Spec) -> tuple[list[int], list[tuple[int, int]]]:
  """Samples one episode; returns tokens and (answer offset, hops) pairs."""
  names = [vocab.VAR0 + v for v in rng.permutation(r, vocab.NUM_VARS)]
  rhs, parent, chains = [], [], []  # Per node: right-hand token, parent node.
  for _ in range(spec.queries):
    k = 1 + rng.below(r, spec.max_hops)
    rhs.append(vocab.VALUE0 + rng.below(r, vocab.NUM_VALUES))
    parent.append(-1)
    for _ in range(k - 1):
      rhs.append(names[len(rhs) - 1])
      parent.append(len(rhs) - 2)
    chains.append((len(rhs) - 1, k))
  for _ in range(spec.distractors):
    if r.random() < 0.5:
      p = rng.below(r, len(rhs))
      rhs.append(names[p])
      parent.append(p)
    else:
      rhs.append(vocab.VALUE0 + rng.below(r, vocab.NUM_VALUES))
      parent.append(-1)
  assignments = len(rhs)
  for end, k in chains:  # Query nodes wait for their chain's end.
    rhs.append(rhs[end - k + 1])
    parent.append(end)
  children = [[] for _ in rhs]
  for i, p in enumerate(parent):
    if p >= 0:
      children[p].append(i)
  ready = [i for i, p in enumerate(parent) if p < 0]
  out, answers = [], []
  while ready:  # Random topological order of assignments and queries.
    j = rng.below(r, len(ready))
    ready[j], ready[-1] = ready[-1], ready[j]
    i = ready.pop()
    if i < assignments:
      out += [names[i], vocab.EQ, rhs[i], vocab.SEMI]
    else:
      out += [vocab.QUERY, names[parent[i]], vocab.EQ, rhs[i], vocab.SEMI]
      answers.append((len(out) - 2, chains[i - assignments][1]))
    ready += children[i]
  out.append(vocab.EOS)
  return out, answers


def tokens(spec: Spec, r: random.Random, length: int) -> tuple[np.ndarray, np.ndarray]:
  """Fills `length` tokens with episodes; returns tokens and per-target hops."""
  out, hop = [], np.zeros(length - 1, np.int32)
  while len(out) < length:
    toks, answers = episode(r, spec)
    for offset, k in answers:
      t = len(out) + offset - 1  # Target position t predicts token t + 1.
      if t < length - 1:
        hop[t] = k
    out += toks
  return np.asarray(out[:length], np.int32), hop
