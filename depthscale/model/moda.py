"""MoDA, mixture-of-depths attention (hustvl, arXiv 2603.15619, 2026; `model.moda`).

Each head's query attends, under one softmax with the model's logit scale, to the causal
keys and values of its own layer and to the keys and values of the same token produced
by the attention of every preceding layer (the depth stream). Layer l (1-based) reads
the depth entries 1..l-1 and appends its own (k, v) at slot l. With grouped KV heads a
depth entry is shared by its query group, as the sequence keys are. Only attention layers
write depth entries (the authors' released code; the paper also adds a light KV projection
of each FFN output, which is not implemented). Scores are explicit (B x H x T x (T + L)):
the XLA composition, not the CPU blocked or TPU flash kernels.

Carry: moda_k, moda_v of shape L x B x T x K x E (slot l-1 holds layer l's post-RoPE keys;
at a token's own position RoPE's rotation cancels in q . k, so depth scores carry no
position).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_carry(cfg, x_BxTxD) -> dict:
  """Empty depth stream: zeros for every layer's (k, v)."""
  kv, e = cfg.num_kv_heads or cfg.num_heads, cfg.d_model // cfg.num_heads
  zeros = jnp.zeros((cfg.num_layers,) + x_BxTxD.shape[:2] + (kv, e), x_BxTxD.dtype)
  return {'moda_k': zeros, 'moda_v': zeros}


def attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, depth_k_LxBxTxKxE, depth_v_LxBxTxKxE,
              num_valid, scale: float, segments_BxT=None) -> jax.Array:
  """Joint causal-sequence and depth attention; depth slots >= num_valid are masked out;
  with segments_BxT (document ids) no sequence key of another document is read (a depth
  entry is the same token's, so always of its document)."""
  b, t, h, e = q_BxTxHxE.shape
  kv = k_BxTxKxE.shape[2]
  q_BxTxKxGxE = q_BxTxHxE.reshape(b, t, kv, h // kv, e).astype(jnp.float32)
  seq_BxKxGxTxS = jnp.einsum('bqkge,bske->bkgqs', q_BxTxKxGxE, k_BxTxKxE.astype(jnp.float32))
  mask = jnp.tril(jnp.ones((t, t), bool))
  if segments_BxT is not None:
    mask = mask & (segments_BxT[:, None, None, :, None] == segments_BxT[:, None, None, None, :])
  seq_BxKxGxTxS = jnp.where(mask, seq_BxKxGxTxS * scale, -jnp.inf)
  dep_BxKxGxTxL = jnp.einsum('btkge,lbtke->bkgtl', q_BxTxKxGxE,
                             depth_k_LxBxTxKxE.astype(jnp.float32)) * scale
  valid_L = jnp.arange(depth_k_LxBxTxKxE.shape[0]) < num_valid
  dep_BxKxGxTxL = jnp.where(valid_L, dep_BxKxGxTxL, -jnp.inf)
  p = jax.nn.softmax(jnp.concatenate([seq_BxKxGxTxS, dep_BxKxGxTxL], axis=-1), axis=-1)
  p_seq, p_dep = p[..., :t], p[..., t:]
  o = (jnp.einsum('bkgqs,bske->bqkge', p_seq, v_BxTxKxE.astype(jnp.float32))
       + jnp.einsum('bkgtl,lbtke->btkge', p_dep, depth_v_LxBxTxKxE.astype(jnp.float32)))
  return o.reshape(b, t, h, e).astype(q_BxTxHxE.dtype)


class DepthStream:
  """The attention hook of one block: attends over the carried depth stream and, after the
  block, writes this layer's (k, v) into its slot."""

  def __init__(self, carry: dict, layer: dict):
    self.carry, self.slot = carry, layer['index'] - 1  # layer l reads slots 0..l-2
    self.own = None

  def __call__(self, q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale: float, segments_BxT=None):
    self.own = (k_BxTxKxE, v_BxTxKxE)
    return attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, self.carry['moda_k'], self.carry['moda_v'],
                     self.slot, scale, segments_BxT)

  def update(self, carry: dict) -> dict:
    """The carry with this layer's keys and values appended to the depth stream."""
    k, v = self.own
    return {**carry, 'moda_k': carry['moda_k'].at[self.slot].set(k.astype(carry['moda_k'].dtype)),
            'moda_v': carry['moda_v'].at[self.slot].set(v.astype(carry['moda_v'].dtype))}
