"""The residual streams of a model on a batch, h_0 (the embedding) to h_L, and its loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from depthscale.model import residual
from depthscale.model.transformer import Transformer
from depthscale.training.steps import weighted_loss


def residual_streams(model: Transformer, params, batch: dict) -> jax.Array:
  """h_SxBxTxD, S = L + 1: the stream entering block 1 (h_0) and leaving each block, the
  residual design's view of its carry, never final-normed."""
  view = residual.DESIGNS[model.cfg.residual].view

  def run(m, tokens, segments):
    x_BxTxD = m.embed(tokens)
    m.stack(x_BxTxD, None, segments)
    return view(m.start(x_BxTxD))

  h0_BxTxD, sown = model.apply({'params': params}, batch['inputs'], batch.get('segments'),
                               method=run, mutable=['intermediates'])
  h_LxBxTxD = sown['intermediates']['blocks']['x_out'][0]
  return jnp.concatenate([h0_BxTxD[None], h_LxBxTxD.astype(h0_BxTxD.dtype)])


def loss(model: Transformer, params, batch: dict) -> jax.Array:
  """The mean next-token loss of the model on the batch."""
  logits, _ = model.apply({'params': params}, batch['inputs'], None, batch.get('segments'))
  return weighted_loss(logits, batch)
