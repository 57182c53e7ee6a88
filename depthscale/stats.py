"""The one recording site of per-layer statistics, called by every block on logging steps.

Shapes: x_BxTxD is a residual stream. Each statistic is a scalar per block; the scan
stacks them into one vector of length L (block 1 first).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LAYER_STATS = ('act_var', 'act_rms', 'update_ratio')


def _token_norm(x_BxTxD):
  return jnp.sqrt(jnp.sum(jnp.square(x_BxTxD), axis=-1))


def block_stats(trace: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Statistics of one block from its trace, in float32.

  The trace holds 'x_in' and 'x_out' (the stream entering and leaving the block) and,
  per sublayer ('attn', 'mlp'), the update it made to the stream.

  act_var: variance over batch, tokens and features of the stream leaving the block.
  act_rms: root mean square of that stream.
  update_ratio: mean over tokens of ||x_out - x_in|| / ||x_in||.
  """
  x_in = trace['x_in'].astype(jnp.float32)
  x_out = trace['x_out'].astype(jnp.float32)
  ratio = _token_norm(x_out - x_in) / jnp.maximum(_token_norm(x_in), 1e-30)
  return {
      'act_var': jnp.var(x_out),
      'act_rms': jnp.sqrt(jnp.mean(jnp.square(x_out))),
      'update_ratio': jnp.mean(ratio),
  }


def per_layer_norm(tree) -> jax.Array:
  """L2 norm per layer of a pytree whose leaves all have a leading layer axis."""
  sq = [jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
        for g in jax.tree.leaves(tree)]
  return jnp.sqrt(sum(sq))
