"""The one recording site of per-layer statistics, called by every block on logging steps.

Shapes: x_BxTxD is a residual stream. Each statistic is a scalar per block; the scan
stacks them into one vector of length L (block 1 first). Token means run over batch and
positions; norms and cosines are taken over the feature axis D of each token.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

SATURATION_THRESHOLD = 0.99  # |tanh| or |erf| above this counts as saturated
_TINY = 1e-30


def _token_norm(x_BxTxD):
  return jnp.sqrt(jnp.sum(jnp.square(x_BxTxD), axis=-1))


def _ratio(a_BxTxD, b_BxTxD):
  """Token mean of ||a|| / ||b||."""
  return jnp.mean(_token_norm(a_BxTxD) / jnp.maximum(_token_norm(b_BxTxD), _TINY))


def _cos(a_BxTxD, b_BxTxD):
  """Token mean of cos(a, b)."""
  dot = jnp.sum(a_BxTxD * b_BxTxD, axis=-1)
  return jnp.mean(dot / jnp.maximum(_token_norm(a_BxTxD) * _token_norm(b_BxTxD), _TINY))


def kurtosis(x_BxTxD):
  """Token mean of the kurtosis across features, E[(x - mu)^4] / sigma^4 (Gaussian: 3)."""
  c = x_BxTxD - jnp.mean(x_BxTxD, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(c), axis=-1)
  return jnp.mean(jnp.mean(jnp.square(jnp.square(c)), axis=-1) / jnp.maximum(jnp.square(var), _TINY))


def block_stats(trace: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Statistics of one block from its trace, in float32.

  The trace holds 'x_in' (h, the stream entering the block) and 'x_out' (leaving it) and,
  per sublayer, the update it made to the stream: 'attn' (a) and 'mlp' (m). For Pre-LN
  x_out = h + a + m; for placements that normalize the stream the update includes the norm.

  act_var, act_rms: variance and root mean square (over batch, tokens, features) of x_out.
  update_ratio: token mean of ||x_out - h|| / ||h||  (Csordas et al. 2025: R_l).
  attn_contrib: token mean of ||a|| / ||h||  (Csordas et al. 2025: R_a).
  mlp_contrib: token mean of ||m|| / ||h + a||  (Csordas et al. 2025: R_m).
  cos_in_out: token mean of cos(h, x_out)  (1 - ShortGPT's Block Influence).
  attn_cos, mlp_cos, update_cos: token means of cos(a, h), cos(m, h + a) and
    cos(x_out - h, h) (Csordas et al. 2025; their mean gives effective_depth/cos).
  max_abs_act: max |x_out| (massive activations, Sun et al. 2024).
  kurtosis: token mean of the kurtosis of x_out across features (Gaussian: 3).
  """
  h = trace['x_in'].astype(jnp.float32)
  a = trace['attn'].astype(jnp.float32)
  m = trace['mlp'].astype(jnp.float32)
  x_out = trace['x_out'].astype(jnp.float32)
  update = x_out - h
  return {
      'act_var': jnp.var(x_out),
      'act_rms': jnp.sqrt(jnp.mean(jnp.square(x_out))),
      'update_ratio': _ratio(update, h),
      'attn_contrib': _ratio(a, h),
      'mlp_contrib': _ratio(m, h + a),
      'cos_in_out': _cos(h, x_out),
      'attn_cos': _cos(a, h),
      'mlp_cos': _cos(m, h + a),
      'update_cos': _cos(update, h),
      'max_abs_act': jnp.max(jnp.abs(x_out)),
      'kurtosis': kurtosis(x_out),
  }


def record_saturation(module: nn.Module, u: jax.Array) -> None:
  """Hook for norm-free pointwise norms (DyT, Derf): call with u = tanh(.) or erf(.)
  inside the norm's __call__. Records the fraction of units with |u| > 0.99.

  It sows into the 'intermediates' collection, which only the statistics path makes
  mutable, so the plain step computes nothing. Per layer, `saturation` is the mean over
  the block's recording norms.
  """
  frac = jnp.mean((jnp.abs(u.astype(jnp.float32)) > SATURATION_THRESHOLD).astype(jnp.float32))
  module.sow('intermediates', 'saturation', frac)


def saturation_per_layer(intermediates) -> dict[str, jax.Array]:
  """{'saturation': length-L vector} from the blocks' sown values ({} if nothing recorded)."""
  found = []

  def visit(path, leaf):
    if any(getattr(k, 'key', None) == 'saturation' for k in path):
      found.append(leaf.reshape(leaf.shape[0], -1).mean(axis=1))

  jax.tree_util.tree_map_with_path(visit, intermediates.get('blocks', {}))
  return {'saturation': sum(found) / len(found)} if found else {}


def attention_entropy(q_BxTxHxE, k_BxTxKxE, scale: float | None = None) -> jax.Array:
  """Per head H: mean over batch and query positions i of -sum_{j<=i} a_ij ln a_ij,
  with a the causal softmax attention probabilities (explicit; analysis path only).
  scale: the softmax scale the model uses (None = 1/sqrt(E))."""
  h, kh = q_BxTxHxE.shape[2], k_BxTxKxE.shape[2]
  k_BxTxHxE = jnp.repeat(k_BxTxKxE, h // kh, axis=2)
  q = q_BxTxHxE.astype(jnp.float32)
  scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
  logits_BxHxTxT = jnp.einsum('bihe,bjhe->bhij', q, k_BxTxHxE.astype(jnp.float32)) * scale
  t = q.shape[1]
  causal_TxT = jnp.tril(jnp.ones((t, t), bool))
  logp = jax.nn.log_softmax(jnp.where(causal_TxT, logits_BxHxTxT, -jnp.inf), axis=-1)
  ent_BxHxT = -jnp.sum(jnp.where(causal_TxT, jnp.exp(logp) * logp, 0.0), axis=-1)
  return jnp.mean(ent_BxHxT, axis=(0, 2))


def per_layer_norm(tree) -> jax.Array:
  """L2 norm per layer of a pytree whose leaves all have a leading layer axis."""
  sq = [jnp.sum(jnp.square(g.astype(jnp.float32)).reshape(g.shape[0], -1), axis=1)
        for g in jax.tree.leaves(tree)]
  return jnp.sqrt(sum(sq))
