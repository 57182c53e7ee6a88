"""Training compute of a rung and groups of rungs at equal compute.

C = 6 N tokens + 6 L T D tokens (Kaplan et al. 2020, arXiv:2001.08361, Table 1 and Sec. 2.1):
a forward pass costs 2 N FLOPs per token for the N non-embedding parameters plus
2 L T d_attn for the causal attention scores and their weighted sum (per query on average
T / 2 keys, 2 d_attn FLOPs each for QK^T and for AV), the backward pass twice the forward.
Here d_attn = D (head_dim = D / H). Embeddings and the LM head are left out, as in Kaplan's
C = 6 N D; Hoffmann et al. 2022 (arXiv:2203.15556, App. F) also count them and the full
T x T score matrix.
"""

from __future__ import annotations

import numpy as np

ISOFLOP_TOLERANCE = 0.15  # rungs whose FLOPs agree within 15% form one iso-FLOP group


def training_flops(non_embedding_params: float, tokens: float, num_layers: int,
                   seq_len: int, d_model: int) -> float:
  """6 N tokens + 6 L T D tokens: a rung's training FLOPs."""
  return 6.0 * tokens * (non_embedding_params + num_layers * seq_len * d_model)


def isoflop_groups(flops, tolerance: float = ISOFLOP_TOLERANCE) -> list[np.ndarray]:
  """Indices of runs of rungs, sorted by FLOPs, whose largest FLOPs is at most (1 + tolerance)
  times their smallest (greedy from the smallest); groups of one rung left out."""
  flops = np.asarray(flops, float)
  order = np.argsort(flops, kind='stable')
  groups, start = [], 0
  for i in range(1, len(order) + 1):
    if i == len(order) or flops[order[i]] > flops[order[start]] * (1 + tolerance):
      if i - start > 1:
        groups.append(order[start:i])
      start = i
  return groups
