"""Decoder-only causal Transformer LM; blocks stacked with nn.scan over one definition.

Shape names: B batch, T tokens, D d_model, H query heads, K kv heads, E head_dim,
F MLP width, V vocab, L layers. Every parameter carries logical axis names
(`embed`, `mlp`, `heads`, `kv`, `vocab`, `layers`) for the sharding rules.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from depthscale import residual
from depthscale.blocks import PLACEMENTS, Sublayer, layer_schedule
from depthscale.norms import make_norm
from depthscale.stats import attention_entropy, block_stats

EMBEDDING_PARAMS = ('embedding', 'pos_embedding', 'head')


def d_ff(cfg) -> int:
  """MLP hidden width F."""
  return cfg.d_ff or int(round(cfg.mlp_ratio * cfg.d_model))


def _dense_param(module: nn.Module, name: str, shape, axes, std: float):
  init = nn.with_logical_partitioning(nn.initializers.normal(std), axes)
  return module.param(name, init, shape, jnp.float32)


def constrain(x, *names: str | None):
  """Activation sharding by logical axis names (a no-op unless rules and a mesh are in scope)."""
  return nn.with_logical_constraint(x, names)


def rope(x_BxTxNxE, base: float):
  """Rotary position embedding (rotate-half form) over the head dimension."""
  t, e = x_BxTxNxE.shape[1], x_BxTxNxE.shape[-1]
  inv_freq = base ** (-np.arange(0, e, 2, dtype=np.float32) / e)
  angle_TxE2 = np.arange(t, dtype=np.float32)[:, None] * inv_freq[None]
  cos, sin = (jnp.asarray(f(angle_TxE2))[None, :, None, :] for f in (np.cos, np.sin))
  x1, x2 = jnp.split(x_BxTxNxE.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxE.dtype)


class Attention(nn.Module):
  """Causal multi-head attention with optional grouped KV heads."""
  cfg: Any

  @nn.compact
  def __call__(self, x_BxTxD, mix_values=None):
    """mix_values(v_BxTxKxE, x_BxTxD) -> v_BxTxKxE: the value-residual hook (or None)."""
    cfg = self.cfg
    dt = jnp.dtype(cfg.dtype)
    h, k = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
    e = cfg.d_model // h
    std = cfg.init_std
    wq = _dense_param(self, 'q', (cfg.d_model, h, e), ('embed', 'heads', 'kv'), std)
    wkv = _dense_param(self, 'kv', (cfg.d_model, 2, k, e), ('embed', None, 'heads', 'kv'), std)
    wo = _dense_param(self, 'o', (h, e, cfg.d_model), ('heads', 'kv', 'embed'), std)
    x = x_BxTxD.astype(dt)
    q_BxTxHxE = constrain(jnp.einsum('btd,dhe->bthe', x, wq.astype(dt)), 'batch', None, 'heads', 'kv')
    kv_2xBxTxKxE = jnp.einsum('btd,dcke->cbtke', x, wkv.astype(dt))
    k_BxTxKxE, v_BxTxKxE = kv_2xBxTxKxE[0], kv_2xBxTxKxE[1]
    if mix_values is not None:
      v_BxTxKxE = mix_values(v_BxTxKxE, x)
    if cfg.position == 'rope':
      q_BxTxHxE, k_BxTxKxE = rope(q_BxTxHxE, cfg.rope_base), rope(k_BxTxKxE, cfg.rope_base)
    if self.is_mutable_collection('analysis'):  # explicit probabilities: analysis path only
      self.sow('analysis', 'attn_entropy', attention_entropy(q_BxTxHxE, k_BxTxKxE))
    o_BxTxHxE = jax.nn.dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, is_causal=True)
    return jnp.einsum('bthe,hed->btd', o_BxTxHxE, wo.astype(dt))


class Mlp(nn.Module):
  """GELU (tanh form) or SwiGLU feed-forward network."""
  cfg: Any

  @nn.compact
  def __call__(self, x_BxTxD):
    cfg = self.cfg
    dt = jnp.dtype(cfg.dtype)
    f, std = d_ff(cfg), cfg.init_std
    x = x_BxTxD.astype(dt)
    if cfg.mlp == 'swiglu':
      wi = _dense_param(self, 'wi', (cfg.d_model, 2, f), ('embed', None, 'mlp'), std)
      gate_up_BxTx2xF = jnp.einsum('btd,dcf->btcf', x, wi.astype(dt))
      h_BxTxF = nn.silu(gate_up_BxTx2xF[..., 0, :]) * gate_up_BxTx2xF[..., 1, :]
      h_BxTxF = constrain(h_BxTxF, 'batch', None, 'mlp')
    else:
      wi = _dense_param(self, 'wi', (cfg.d_model, f), ('embed', 'mlp'), std)
      h_BxTxF = jax.nn.gelu(jnp.einsum('btd,df->btf', x, wi.astype(dt)), approximate=True)
      h_BxTxF = constrain(h_BxTxF, 'batch', None, 'mlp')
    wo = _dense_param(self, 'wo', (f, cfg.d_model), ('mlp', 'embed'), std)
    return jnp.einsum('btf,fd->btd', h_BxTxF, wo.astype(dt))


class Block(nn.Module):
  """One Transformer block, assembled from the placement table and the residual design
  (depthscale.residual); scanned over layers."""
  cfg: Any
  collect_stats: bool = False

  @nn.compact
  def __call__(self, carry: dict, layer: dict):
    cfg = self.cfg
    place, design = PLACEMENTS[cfg.block], residual.DESIGNS[cfg.residual]
    values = residual.ValueResidual(cfg, self, carry, layer) if cfg.value_residual != 'none' else None
    attn, mlp = Attention(cfg, name='attn'), Mlp(cfg, name='mlp')
    subs = [Sublayer('attn', lambda y: attn(y, values), self.norm_factory('attn'), layer),
            Sublayer('mlp', mlp, self.norm_factory('mlp'), layer)]
    parts = {}  # parallel block: the two branch outputs
    if cfg.parallel_block == 'none':
      steps = [(s.name, lambda h, s=s: place.sublayer(h, s)) for s in subs]
    else:
      steps = [('block', residual.parallel_step(*subs, cfg.parallel_block == 'gptj', parts))]
    trace = {'x_in': design.view(carry)}  # what the recording site sees: streams and updates
    for j, (name, step) in enumerate(steps):
      k = (layer['index'] - 1) * len(steps) + j  # 0-based residual-sublayer index
      before = design.view(carry)
      h, write = design.connection(cfg, name=f'res_{name}')(carry, k)
      carry = write(step(h))
      trace.update(parts or {name: design.view(carry) - before})  # parallel: both branch outputs
    if design.block_end is not None:
      carry = design.block_end(cfg, name='res_dwa')(carry, layer['index'])
    if values is not None:
      carry = values.update(carry)
    trace['x_out'] = design.view(carry)
    stats = block_stats(trace) if self.collect_stats else {}
    return carry, stats

  def norm_factory(self, name: str):
    """norm(role) -> the norm module of sublayer `name` for that role."""
    return lambda role: make_norm(self.cfg, f'{name}_norm' if role == 'in' else f'{name}_norm_{role}')


def block_stack(cfg, collect_stats: bool):
  """The scanned (and optionally rematerialized) stack of cfg.num_layers blocks."""
  block = Block
  if cfg.remat != 'none':
    block = nn.remat(Block, policy=getattr(jax.checkpoint_policies, cfg.remat), prevent_cse=False)
  return nn.scan(block, variable_axes={'params': 0, 'intermediates': 0}, split_rngs={'params': True},
                 in_axes=0, length=cfg.num_layers,
                 metadata_params={nn.PARTITION_NAME: 'layers'})(cfg, collect_stats)


class Transformer(nn.Module):
  """Embeddings, scanned blocks, final norm (if the placement needs one), LM head.

  Returns (logits_BxTxV in float32, stats) where stats maps each per-layer statistic
  to a length-L vector when collect_stats is set, else is empty.
  """
  cfg: Any
  max_len: int
  collect_stats: bool = False

  def setup(self):
    cfg = self.cfg
    emb_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), ('vocab', 'embed'))
    self.embedding = self.param('embedding', emb_init, (cfg.vocab_size, cfg.d_model), jnp.float32)
    if cfg.position == 'learned':
      pos_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), (None, 'embed'))
      self.pos_embedding = self.param('pos_embedding', pos_init, (self.max_len, cfg.d_model), jnp.float32)
    self.blocks = block_stack(cfg, self.collect_stats)
    readout = residual.DESIGNS[cfg.residual].readout
    if readout is not None:
      self.res_readout = readout(cfg)
    if PLACEMENTS[cfg.block].final_norm:
      self.final_norm = make_norm(cfg, 'final_norm')
    if not cfg.tie_embeddings:
      head_init = nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), ('embed', 'vocab'))
      self.head = self.param('head', head_init, (cfg.d_model, cfg.vocab_size), jnp.float32)

  def embed(self, tokens_BxT):
    """Token (+ learned position) embedding: the stream entering block 1."""
    x_BxTxD = jnp.take(self.embedding, tokens_BxT, axis=0)
    if self.cfg.position == 'learned':
      x_BxTxD = x_BxTxD + self.pos_embedding[None, :tokens_BxT.shape[1]]
    return constrain(x_BxTxD.astype(jnp.dtype(self.cfg.dtype)), 'batch', None, None)

  def unembed(self, x_BxTxD):
    """Final norm (if any) and LM head, in float32."""
    if PLACEMENTS[self.cfg.block].final_norm:
      x_BxTxD = self.final_norm(x_BxTxD)
    w_DxV = self.embedding.T if self.cfg.tie_embeddings else self.head
    dt = jnp.dtype(self.cfg.dtype)
    logits_BxTxV = jnp.einsum('btd,dv->btv', x_BxTxD.astype(dt), w_DxV.astype(dt))
    return constrain(logits_BxTxV.astype(jnp.float32), 'batch', None, 'vocab')

  def start(self, x_BxTxD) -> dict:
    """The scan carry entering block 1 (the residual design's state)."""
    return residual.init_carry(self.cfg, x_BxTxD)

  def finish(self, carry: dict):
    """The one stream leaving the stack (e.g. HC's n streams read out), before the final norm."""
    return self.res_readout(carry) if residual.DESIGNS[self.cfg.residual].readout else carry['x']

  def stack(self, x_BxTxD):
    """The scanned blocks: (stream leaving block L, per-layer stats)."""
    carry, stats = self.blocks(self.start(x_BxTxD), layer_schedule(self.cfg))
    return self.finish(carry), stats

  def __call__(self, tokens_BxT):
    x_BxTxD, stats = self.stack(self.embed(tokens_BxT))
    return self.unembed(x_BxTxD), stats


def make_model(cfg, collect_stats: bool = False) -> Transformer:
  """Builds the model from a full config (model section + data.seq_len)."""
  frozen = ml_collections.FrozenConfigDict(cfg.model)  # hashable: module attributes are static
  return Transformer(frozen, max_len=cfg.data.seq_len, collect_stats=collect_stats)


def apply_unrolled(model: Transformer, params, tokens_BxT):
  """Reference forward pass with a Python loop over layers (tests and benchmarks)."""
  cfg = model.cfg
  carry = model.apply({'params': params}, tokens_BxT, method=lambda m, t: m.start(m.embed(t)))
  schedule = layer_schedule(cfg)
  for l in range(cfg.num_layers):
    layer_params = jax.tree.map(lambda p, l=l: p[l], params['blocks'])
    layer = jax.tree.map(lambda s, l=l: s[l], schedule)
    carry, _ = Block(cfg).apply({'params': layer_params}, carry, layer)
  x_BxTxD = model.apply({'params': params}, carry, method=Transformer.finish)
  return model.apply({'params': params}, x_BxTxD, method=Transformer.unembed)


def param_counts(params) -> tuple[int, int]:
  """(total, non-embedding) parameter counts; embeddings, positions and an untied head excluded."""
  total = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  emb = sum(int(np.prod(params[k].shape)) for k in EMBEDDING_PARAMS if k in params)
  return total, total - emb
