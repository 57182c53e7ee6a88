"""Layer pruning with healing (Gromov et al. 2024, arXiv 2403.17887).

For a block size n, the distance of the n blocks starting at block l (0-based) is the angular
distance between the stream entering them and the stream leaving them,
d(l, n) = arccos(cos(h_l[T], h_{l+n}[T])) / pi on the last token T, mean over sequences
(depthscale.training.analysis.angular_distance); the blocks l*, ..., l*+n-1 with
l* = argmin_l d(l, n) are dropped (a slice of the stacked parameters along the layer axis)
and the shorter model is fine-tuned ("healed"; the paper uses QLoRA, here every parameter).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from depthscale.errors import invalid
from depthscale.model import parametrization as pz
from depthscale.model.placements import layer_schedule
from depthscale.training.analysis import angular_distance


def block_distances(h_SxBxTxD: jax.Array, n: int) -> jax.Array:
  """d(l, n) for l = 0..S-1-n from the streams h_0..h_{S-1} (S = L + 1)."""
  starts = h_SxBxTxD.shape[0] - n
  return jax.vmap(angular_distance)(h_SxBxTxD[:starts], h_SxBxTxD[n:])


def drop_blocks(params, first: int, n: int):
  """params without blocks first..first+n-1 (0-based): every stacked leaf sliced along L."""
  keep = lambda w: jnp.concatenate([w[:first], w[first + n:]])
  return {**params, 'blocks': jax.tree.map(keep, params['blocks'])}


def check_prunable(src_cfg, cfg) -> None:
  """Raises ConfigError unless dropping blocks of src_cfg's model leaves every other block
  computing what it did: a plain residual stream, and per-layer constants and branch
  multipliers that depend neither on the block's index nor on the layer count."""
  m, n = cfg.model, cfg.posthoc.prune_layers
  if m.num_layers != src_cfg.model.num_layers - n:
    raise invalid('model.num_layers', m.num_layers, f'{src_cfg.model.num_layers - n}, the '
                  f'init_from model\'s {src_cfg.model.num_layers} minus posthoc.prune_layers={n}')
  if (m.residual, m.value_residual, m.moda, m.mlp_taper) != ('standard', 'none', False, 'none'):
    raise invalid('posthoc.prune_layers', n, "0 unless model.residual='standard', "
                  "model.value_residual='none', model.moda=False (streams that span layers) "
                  "and model.mlp_taper='none' (widths set by the depth)")
  old, new = layer_schedule(src_cfg.model), layer_schedule(m)
  constant = all(np.ptp(np.asarray(old[k], np.float32)) == 0 and
                 np.asarray(old[k])[0] == np.asarray(new[k])[0] for k in old if k != 'index')
  same_mult = (pz.branch_mult(m), pz.skip_mult(m)) == (pz.branch_mult(src_cfg.model),
                                                      pz.skip_mult(src_cfg.model))
  if not (constant and same_mult):
    raise invalid('posthoc.prune_layers', n, '0 for a model whose per-layer constants or branch '
                  'multipliers depend on the depth (model.ln_scaling, Mix-LN, DeepNorm / Keel '
                  'alpha, depth-muP / CompleteP with a base depth)')
