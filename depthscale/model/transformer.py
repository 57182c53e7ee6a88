"""Decoder-only causal Transformer LM; blocks stacked with nn.scan over one definition.

Shape names: B batch, T tokens, D d_model, H query heads, K kv heads, E head_dim,
F MLP width, V vocab, L layers. Every parameter carries logical axis names
(`embed`, `mlp`, `heads`, `kv`, `vocab`, `layers`) for the sharding rules.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from depthscale.model import inner_norms, layer_rope, moda, ngpt, ops, recurrence, residual, taper
from depthscale.model import parametrization as pz
from depthscale.model.norms import NORMS, l2_normalize, make_norm
from depthscale.model.param_tree import EMBEDDING_PARAMS
from depthscale.model.placements import PLACEMENTS, layer_schedule, sublayer_factory
from depthscale.model.stats import attention_entropy, block_stats

def d_ff(cfg) -> int:
  """MLP hidden width F of every block's parameters (under model.mlp_taper the widest
  block's; the others mask their extra units, see depthscale.model.taper)."""
  return taper.param_width(cfg)


def _dense_param(module: nn.Module, name: str, shape, axes, std):
  """A normal-init matrix; std is a float or broadcasts against shape (one per slice).
  Under nGPT each weight vector is then normalized along its D ('embed') axis."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, dtype) * jnp.asarray(std, dtype)
  if PLACEMENTS[module.cfg.block].unit_sphere:
    init = ngpt.unit_init(init, axes.index('embed'))
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


def _std(cfg, role: str, fan_in: int, fan_out: int, index=None):
  """Init std of a matrix: the placement's own scheme where its row sets one (DeepNorm, Sub-LN,
  HybridNorm, SimpleGPT), else model.init; the parametrization's width factor applies."""
  return pz.init_std(cfg, role, fan_in, fan_out, index, scheme=PLACEMENTS[cfg.block].init)


def _bias(module: nn.Module, name: str, size: int, axis: str | None):
  """A zero-init bias vector of a matrix's outputs (model.attn_bias, model.mlp_bias)."""
  init = nn.with_logical_partitioning(nn.initializers.zeros, (axis,))
  return module.param(name, init, (size,), jnp.float32)


def constrain(x, *names: str | None):
  """Activation sharding by logical axis names (a no-op unless rules and a mesh are in scope)."""
  return nn.with_logical_constraint(x, names)


def rope_frequencies(cfg, e: int) -> np.ndarray:
  """The E/2 rotary frequencies base^(-2i/E), scaled as model.rope_scaling says: 'linear'
  divides them by the factor (position interpolation, Chen et al. 2023); 'llama3' divides the
  low-frequency band (wavelength > L0 / low_freq_factor, L0 = model.rope_original_max_len) by
  it, keeps the high band (< L0 / high_freq_factor) and interpolates between (Llama 3.1)."""
  inv_freq = cfg.rope_base ** (-np.arange(0, e, 2, dtype=np.float32) / e)
  factor = np.float32(cfg.rope_scaling_factor)
  if cfg.rope_scaling == 'linear':
    return inv_freq / factor
  if cfg.rope_scaling == 'llama3':
    lo, hi, l0 = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_max_len
    wavelen = 2 * np.pi / inv_freq
    smooth = ((l0 / wavelen - lo) / (hi - lo)).astype(np.float32)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return np.where(wavelen > l0 / lo, inv_freq / factor,
                    np.where(wavelen < l0 / hi, inv_freq, interpolated)).astype(np.float32)
  return inv_freq


def rope(x_BxTxNxE, base: float | np.ndarray):
  """Rotary position embedding (rotate-half form) over the head dimension; base is the
  frequency base, or the E/2 frequencies themselves (rope_frequencies)."""
  t, e = x_BxTxNxE.shape[1], x_BxTxNxE.shape[-1]
  inv_freq = (base ** (-np.arange(0, e, 2, dtype=np.float32) / e) if np.ndim(base) == 0
              else np.asarray(base, np.float32))
  angle_TxE2 = np.arange(t, dtype=np.float32)[:, None] * inv_freq[None]
  cos, sin = (jnp.asarray(f(angle_TxE2))[None, :, None, :] for f in (np.cos, np.sin))
  x1, x2 = jnp.split(x_BxTxNxE.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxNxE.dtype)


class Attention(nn.Module):
  """Causal multi-head attention with optional grouped KV heads and biases (model.attn_bias:
  on q, k, v ('qkv', as Qwen2) or on every projection ('all', as GPT-2))."""
  cfg: Any

  @nn.compact
  def __call__(self, x_BxTxD, mix_values=None, index=None, segments_BxT=None, depth=None):
    """mix_values(v_BxTxKxE, x_BxTxD) -> v_BxTxKxE: the value-residual hook (or None);
    segments_BxT: document ids, no attention across them (None: plain causal);
    depth(q, k, v, scale, segments) -> o: MoDA's attention over the depth stream (or None)."""
    cfg = self.cfg
    dt = jnp.dtype(cfg.dtype)
    h, k = cfg.num_heads, cfg.num_kv_heads or cfg.num_heads
    e = cfg.d_model // h
    d = cfg.d_model
    wq = _dense_param(self, 'q', (d, h, e), ('embed', 'heads', 'kv'), _std(cfg, 'q', d, h * e, index))
    std_kv = jnp.stack([jnp.asarray(_std(cfg, r, d, k * e, index)) for r in ('k', 'v')]).reshape(2, 1, 1)
    wkv = _dense_param(self, 'kv', (d, 2, k, e), ('embed', None, 'heads', 'kv'), std_kv)
    wo = _dense_param(self, 'o', (h, e, d), ('heads', 'kv', 'embed'), _std(cfg, 'o', h * e, d, index))
    x = x_BxTxD.astype(dt)
    b, t = x.shape[:2]
    # one fused projection for q, k, v (weights concatenated; shapes of q and kv kept)
    w_DxQKV = jnp.concatenate([wq.reshape(d, h * e), wkv.reshape(d, 2 * k * e)], axis=1)
    qkv = ops.matmul(x, w_DxQKV.astype(dt))
    if cfg.attn_bias != 'none':  # q, k, v biases, one fused vector as the weights
      qkv = qkv + _bias(self, 'qkv_bias', (h + 2 * k) * e, None).astype(dt)
    q_BxTxHxE = constrain(qkv[..., :h * e].reshape(b, t, h, e), 'batch', None, 'heads', 'kv')
    k_BxTxKxE = qkv[..., h * e:(h + k) * e].reshape(b, t, k, e)
    v_BxTxKxE = qkv[..., (h + k) * e:].reshape(b, t, k, e)
    if mix_values is not None:
      v_BxTxKxE = mix_values(v_BxTxKxE, x)
    q_BxTxHxE, k_BxTxKxE, v_BxTxKxE = inner_norms.qkv(self, cfg, q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
    if cfg.position == 'rope':
      freq = rope_frequencies(cfg, e)
      q_BxTxHxE, k_BxTxKxE = rope(q_BxTxHxE, freq), rope(k_BxTxKxE, freq)
    q_BxTxHxE, k_BxTxKxE, scale = inner_norms.scores(self, cfg, q_BxTxHxE, k_BxTxKxE)
    scale = pz.attention_scale(cfg) if scale is None else scale
    if self.is_mutable_collection('analysis'):  # explicit probabilities: analysis path only
      self.sow('analysis', 'attn_entropy', attention_entropy(q_BxTxHxE, k_BxTxKxE, scale))
    if depth is None:
      o_BxTxHxE = ops.attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, cfg.attention_kernel,
                                segments_BxT)
    else:
      o_BxTxHxE = depth(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, segments_BxT)
    o_BxTxHxE = inner_norms.heads(self, cfg, o_BxTxHxE)
    out_BxTxD = ops.matmul(o_BxTxHxE.reshape(b, t, h * e), wo.reshape(h * e, d).astype(dt))
    if cfg.attn_bias == 'all':
      out_BxTxD = out_BxTxD + _bias(self, 'o_bias', d, 'embed').astype(dt)
    return inner_norms.attn_out(self, cfg, out_BxTxD)


class Mlp(nn.Module):
  """Feed-forward network: W_out act(W_in x), act from ops.ACTIVATIONS (model.mlp: GELU,
  ReLU, squared ReLU), or SwiGLU; hidden units past the block's tapered width masked; with
  model.mlp_bias both matrices have biases (GPT-2)."""
  cfg: Any

  @nn.compact
  def __call__(self, x_BxTxD, index=None):
    cfg = self.cfg
    dt = jnp.dtype(cfg.dtype)
    f, d = d_ff(cfg), cfg.d_model
    x = x_BxTxD.astype(dt)
    if cfg.mlp == 'swiglu':
      std = jnp.stack([jnp.asarray(_std(cfg, r, d, f, index)) for r in ('gate', 'up')]).reshape(2, 1)
      wi = _dense_param(self, 'wi', (d, 2, f), ('embed', None, 'mlp'), std)
      gate_up_BxTx2F = ops.matmul(x, wi.reshape(d, 2 * f).astype(dt))
      if cfg.mlp_bias:
        gate_up_BxTx2F = gate_up_BxTx2F + _bias(self, 'wi_bias', 2 * f, None).astype(dt)
      gate_up_BxTx2xF = inner_norms.mlp_in(self, cfg, gate_up_BxTx2F.reshape(*x.shape[:2], 2, f))
      h_BxTxF = nn.silu(gate_up_BxTx2xF[..., 0, :]) * gate_up_BxTx2xF[..., 1, :]
      h_BxTxF = constrain(h_BxTxF, 'batch', None, 'mlp')
    else:
      wi = _dense_param(self, 'wi', (d, f), ('embed', 'mlp'), _std(cfg, 'up', d, f, index))
      pre_BxTxF = ops.matmul(x, wi.astype(dt))
      if cfg.mlp_bias:
        pre_BxTxF = pre_BxTxF + _bias(self, 'wi_bias', f, 'mlp').astype(dt)
      pre_BxTxF = inner_norms.mlp_in(self, cfg, pre_BxTxF)
      h_BxTxF = constrain(ops.ACTIVATIONS[cfg.mlp](pre_BxTxF), 'batch', None, 'mlp')
    wo = _dense_param(self, 'wo', (f, d), ('mlp', 'embed'), _std(cfg, 'down', f, d, index))
    h_BxTxF = taper.mask_hidden(cfg, index, h_BxTxF)
    h_BxTxF = inner_norms.mlp_mid(self, cfg, h_BxTxF)
    out_BxTxD = ops.matmul(h_BxTxF, wo.astype(dt))
    if cfg.mlp_bias:
      out_BxTxD = out_BxTxD + _bias(self, 'wo_bias', d, 'embed').astype(dt)
    return inner_norms.mlp_out(self, cfg, out_BxTxD)


class Block(nn.Module):
  """One Transformer block, assembled from the placement table and the residual design
  (depthscale.residual); scanned over layers."""
  cfg: Any
  collect_stats: bool = False

  def __call__(self, carry: dict, layer: dict):
    """(carry, layer inputs) -> (carry, stats). A placement whose row chooses its wiring per
    layer (Mix-LN) runs only the chosen one: a conditional, which XLA drops altogether when
    the scan is unrolled and the layer schedule is a constant."""
    place = PLACEMENTS[self.cfg.block]
    if place.first_blocks is None:
      return self.wire(carry, layer, place.sublayer)
    return nn.cond(layer['post'], lambda mdl, c, l: mdl.wire(c, l, place.first_blocks),
                   lambda mdl, c, l: mdl.wire(c, l, place.sublayer), self, carry, layer)

  @nn.compact
  def wire(self, carry: dict, layer: dict, rule):
    """The block with placement rule `rule` on each sublayer."""
    cfg = self.cfg
    design = residual.DESIGNS[cfg.residual]
    values = residual.ValueResidual(cfg, self, carry, layer) if cfg.value_residual != 'none' else None
    attn, mlp = Attention(cfg, name='attn'), Mlp(cfg, name='mlp')
    idx = layer['index']
    make_sublayer = sublayer_factory(self, cfg, layer, carry)
    depth = moda.DepthStream(carry, layer) if cfg.moda else None
    segments = layer.get('segments')  # data.document_mask: per-token document ids
    subs = [make_sublayer('attn', lambda y: attn(y, values, index=idx, segments_BxT=segments,
                                                 depth=depth)),
            make_sublayer('mlp', lambda y: mlp(y, index=idx))]

    def scaled(s, h):  # the branch-multiplier hook (parametrizations, ProRes, LayerDrop)
      return dataclasses.replace(s, branch=pz.scale_branch(cfg, s.branch, h,
                                                             layer.get('branch_mult', 1.0)))
    parts = {}  # parallel block: the two branch outputs
    if cfg.parallel_block == 'none':
      steps = [(s.name, lambda h, s=s: rule(h, scaled(s, h))) for s in subs]
    else:
      steps = [('block', residual.parallel_step(*(scaled(s, 0.0) for s in subs),
                                                cfg.parallel_block == 'gptj', parts))]
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
    if depth is not None:
      carry = depth.update(carry)
    trace['x_out'] = design.view(carry)
    self.sow('intermediates', 'x_out', trace['x_out'])  # LayerSkip's early exits (when mutable)
    stats = block_stats(trace) if self.collect_stats else {}
    return carry, stats


def block_stack(cfg, collect_stats: bool):
  """The scanned (and optionally rematerialized) stack of the unique blocks (cfg.num_layers,
  or num_layers / loops under recurrence, where it runs at init only: see loop_scan).

  Up to cfg.unroll_max_layers blocks (resolved by make_model: -1 = 16 when compiled for
  CPU, 0 = never elsewhere) the scan is fully unrolled: straight-line code whose
  saved activations are not copied into per-layer stacks (a rolled scan writes each into a
  zero-filled [L, ...] buffer and reads it back), 1.06-1.14x per train step on CPU
  (benchmarks/NOTES.md); compile time then grows with depth, so deeper models stay rolled,
  and so does the statistics model of the logging steps (one step in log_every; unrolled,
  it compiles ~1.8x slower), and so does a rematerialized one. The parameters ([L, ...]
  stacks) and the computed function are the same either way.
  """
  block = Block
  if cfg.remat != 'none':
    block = nn.remat(Block, policy=getattr(jax.checkpoint_policies, cfg.remat), prevent_cse=False)
  return nn.scan(block, variable_axes={'params': 0, 'intermediates': 0},
                 split_rngs={'params': True}, in_axes=0, length=recurrence.unique_layers(cfg),
                 unroll=scan_unroll(cfg, collect_stats),
                 metadata_params={nn.PARTITION_NAME: 'layers'})(cfg, collect_stats)


def scan_unrolled(cfg, collect_stats: bool) -> bool:
  """Whether the layer scan is fully unrolled (see block_stack)."""
  # Unrolled, the rematerialized stack compiled to the same buffers as without remat (XLA-CPU).
  return not collect_stats and cfg.remat == 'none' and cfg.num_layers <= cfg.unroll_max_layers


def scan_unroll(cfg, collect_stats: bool) -> int:
  """The unique-block scan's unroll factor (see block_stack): U when unrolled, else 1."""
  return recurrence.unique_layers(cfg) if scan_unrolled(cfg, collect_stats) else 1


def history_scan(cfg, layer, params, carry: dict, xs: dict, unroll: int):
  """lax.scan of layer(params_l, carry, xs_l) -> (carry, ys) over the L stacked layers, whose
  backward keeps the design's history carry[history.key] (S slots) once, not once per layer.

  Autodiff of a scan saves each iteration's residuals, and every block reads (and so saves)
  the whole history: O(L S B T D) = O(L^2 d) memory. Here the forward saves per block only the
  rest of its input carry and the history's open slot, O(B T D); the backward rebuilds the
  block's input history from the final one (the slots below the open one are final, the
  later ones zero) and recomputes the block under jax.vjp. One more forward pass, as with
  model.remat=nothing_saveable (which this path makes moot); O(L d) memory.
  """
  history = residual.DESIGNS[cfg.residual].history
  key = history.key

  def scan(body, init, seq, reverse=False):
    return jax.lax.scan(lambda c, s: body(c, *s), init, seq, reverse=reverse, unroll=unroll)

  @jax.custom_vjp
  def run(params, carry, xs):
    return scan(lambda c, p, x: layer(p, c, x), carry, (params, xs))

  def forward(params, carry, xs):
    def body(c, p, x):
      rest = {k: v for k, v in c.items() if k != key}
      out, ys = layer(p, c, x)
      return out, (ys, rest, c[key][history.open_slot(cfg, x['index'])])
    out, (ys, rest, open_LxBxTxD) = scan(body, carry, (params, xs))
    return (out, ys), (params, xs, rest, open_LxBxTxD, out[key])

  def backward(saved, cotangents):
    params, xs, rest, open_LxBxTxD, final_SxBxTxD = saved
    slot = jnp.arange(final_SxBxTxD.shape[0]).reshape((-1,) + (1,) * (final_SxBxTxD.ndim - 1))

    def body(d_carry, p, x, rest_l, open_BxTxD, d_ys):
      n = history.open_slot(cfg, x['index'])
      hist_SxBxTxD = jnp.where(slot < n, final_SxBxTxD, 0).at[n].set(open_BxTxD)
      _, vjp = jax.vjp(lambda p, c: layer(p, c, x), p, {**rest_l, key: hist_SxBxTxD})
      d_p, d_carry = vjp((d_carry, d_ys))
      return d_carry, d_p

    d_carry, d_ys = cotangents
    d_carry, d_params = scan(body, d_carry, (params, xs, rest, open_LxBxTxD, d_ys), reverse=True)
    return d_params, d_carry, None  # no gradient for the layer schedule and inputs

  run.defvjp(forward, backward)
  return run(params, carry, xs)


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
    d, v = cfg.d_model, cfg.vocab_size
    if cfg.fix_norm:  # FixNorm (Nguyen & Salazar 2019): U(-0.01, 0.01), rows normalized in use
      uniform = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -0.01, 0.01)
      emb_init = nn.with_logical_partitioning(uniform, ('vocab', 'embed'))
      self.embedding = self.param('embedding', emb_init, (v, d), jnp.float32)
    else:
      self.embedding = _dense_param(self, 'embedding', (v, d), ('vocab', 'embed'),
                                    _std(cfg, 'embedding', v, d))
    if NORMS[cfg.norm].scales_embedding:  # DyT / Derf: x_0 = s * E[tok], s init sqrt(D)
      self.embed_scale = self.param('embed_scale', nn.initializers.constant(d ** 0.5), (), jnp.float32)
    if cfg.peri_embed_norm:
      self.embed_norm = make_norm(cfg, 'embed_norm')
    if cfg.layer_rope:
      self.layer_rope_gain = layer_rope.shared_gain(self, d)
    if PLACEMENTS[cfg.block].unit_sphere:
      self.logit_scale = ngpt.logit_scale(self, v, d)
    if cfg.position == 'learned':
      pos_init = nn.with_logical_partitioning(
          pz.scaled_normal(pz.init_std(cfg, 'pos_embedding', self.max_len, d)), (None, 'embed'))
      self.pos_embedding = self.param('pos_embedding', pos_init, (self.max_len, cfg.d_model), jnp.float32)
    self.blocks = block_stack(cfg, self.collect_stats)
    if cfg.loop_lora_rank:
      self.loop_lora = recurrence.LoopLora(cfg)
    readout = residual.DESIGNS[cfg.residual].readout
    if readout is not None:
      self.res_readout = readout(cfg)
    if PLACEMENTS[cfg.block].final_norm:
      self.final_norm = make_norm(cfg, 'final_norm')
    if not cfg.tie_embeddings:
      self.head = _dense_param(self, 'head', (d, v), ('embed', 'vocab'), _std(cfg, 'head', d, v))
    if cfg.embed_projection:  # OSP: learnable D x D maps after the embedding, before the head
      ortho = nn.with_logical_partitioning(nn.initializers.orthogonal(), ('embed', None))
      self.embed_proj = self.param('embed_proj', ortho, (d, d), jnp.float32)
      self.head_proj = self.param('head_proj', ortho, (d, d), jnp.float32)

  def _table(self):
    """The token embedding; under FixNorm with unit rows."""
    return l2_normalize(self.embedding) if self.cfg.fix_norm else self.embedding

  def embed(self, tokens_BxT):
    """Token (+ learned position) embedding: the stream entering block 1."""
    cfg = self.cfg
    x_BxTxD = jnp.take(self._table(), tokens_BxT, axis=0)
    if cfg.fix_norm:
      x_BxTxD = x_BxTxD * np.sqrt(cfg.d_model)
    if NORMS[cfg.norm].scales_embedding:
      x_BxTxD = x_BxTxD * self.embed_scale
    if cfg.embed_projection:
      x_BxTxD = jnp.einsum('btd,de->bte', x_BxTxD, self.embed_proj)
    if cfg.position == 'learned':
      x_BxTxD = x_BxTxD + self.pos_embedding[None, :tokens_BxT.shape[1]]
    if cfg.peri_embed_norm:
      x_BxTxD = self.embed_norm(x_BxTxD)
    return constrain(x_BxTxD.astype(jnp.dtype(cfg.dtype)), 'batch', None, None)

  def unembed(self, x_BxTxD):
    """Final norm (if any) and LM head, in float32."""
    if PLACEMENTS[self.cfg.block].final_norm:
      x_BxTxD = self.final_norm(x_BxTxD)
    if self.cfg.embed_projection:
      x_BxTxD = jnp.einsum('btd,de->bte', x_BxTxD, self.head_proj.astype(x_BxTxD.dtype))
    w_DxV = self._table().T if self.cfg.tie_embeddings else self.head
    dt = jnp.dtype(self.cfg.dtype)
    logits_BxTxV = jnp.einsum('btd,dv->btv', x_BxTxD.astype(dt), w_DxV.astype(dt))
    if PLACEMENTS[self.cfg.block].unit_sphere:
      logits_BxTxV = logits_BxTxV * self.logit_scale
    mult = pz.logit_mult(self.cfg)
    logits_BxTxV = logits_BxTxV * mult if mult != 1 else logits_BxTxV
    return constrain(logits_BxTxV.astype(jnp.float32), 'batch', None, 'vocab')

  def start(self, x_BxTxD) -> dict:
    """The scan carry entering block 1 (the residual design's state; LayerRoPE's shared gain)."""
    carry = residual.init_carry(self.cfg, x_BxTxD)
    if self.cfg.moda:
      carry.update(moda.init_carry(self.cfg, x_BxTxD))
    if self.cfg.layer_rope:
      carry['layer_rope_gain'] = self.layer_rope_gain
    return carry

  def finish(self, carry: dict):
    """The one stream leaving the stack (e.g. HC's n streams read out), before the final norm."""
    return self.res_readout(carry) if residual.DESIGNS[self.cfg.residual].readout else carry['x']

  def stack(self, x_BxTxD, layer_inputs: dict | None = None, segments_BxT=None):
    """The scanned blocks: (stream leaving block L, per-layer stats). layer_inputs adds
    step-dependent per-layer scan inputs (leading axis L, see depthscale.dynamics);
    segments_BxT the document ids of document masking."""
    cfg = self.cfg
    carry, xs = self.start(x_BxTxD), scan_inputs(cfg, layer_inputs, segments_BxT)
    if self.is_initializing() and cfg.loops > 1:  # the unique blocks' parameters, then LoRA
      u = recurrence.unique_layers(cfg)
      carry, stats = self.blocks(carry, jax.tree.map(lambda a: a[:u], xs))
      if cfg.loop_lora_rank:
        self.loop_lora(nn.unbox(self.variables['params']['blocks']))
    elif cfg.loops > 1:
      carry, stats = self.functional_blocks(carry, xs, self.loop_scan)
    elif residual.DESIGNS[cfg.residual].history is None or self.is_initializing():
      carry, stats = self.blocks(carry, xs)
    else:
      carry, stats = self.functional_blocks(carry, xs, functools.partial(
          history_scan, cfg, unroll=scan_unroll(cfg, self.collect_stats)))
    return self.finish(carry), stats

  def loop_scan(self, layer, params, carry: dict, xs: dict):
    """Recurrence's scan (depthscale.model.recurrence.loop_scan), the block rematerialized
    by model.remat, the per-loop LoRA factors read from the parameters."""
    cfg = self.cfg
    if cfg.remat != 'none':
      layer = jax.checkpoint(layer, policy=getattr(jax.checkpoint_policies, cfg.remat),
                             prevent_cse=False)
    lora = self.loop_lora(nn.unbox(params)) if cfg.loop_lora_rank else None
    return recurrence.loop_scan(cfg, layer, params, lora, carry, xs,
                                scan_unrolled(cfg, self.collect_stats))

  def functional_blocks(self, carry: dict, xs: dict, scan):
    """The blocks (same parameters, same function) run by scan(layer, params, carry, xs)
    instead of nn.scan: history_scan for designs that carry a history, loop_scan under
    recurrence; the blocks' sown collections are stored as nn.scan stores them."""
    cols = [c for c in ('intermediates', 'analysis') if self.is_mutable_collection(c)]
    block = Block(self.cfg, self.collect_stats, parent=None)

    def layer(p, c, x):
      (c, stats), sown = block.apply({'params': p}, c, x, mutable=cols)
      return c, (stats, sown)

    carry, (stats, sown) = scan(layer, self.variables['params']['blocks'], carry, xs)
    for col, tree in sown.items():
      for name, value in tree.items():
        self.blocks.put_variable(col, name, value)
    return carry, stats

  def __call__(self, tokens_BxT, layer_inputs: dict | None = None, segments_BxT=None):
    x_BxTxD, stats = self.stack(self.embed(tokens_BxT), layer_inputs, segments_BxT)
    return self.unembed(x_BxTxD), stats


CPU_UNROLL_MAX_LAYERS = 16  # model.unroll_max_layers = -1 on CPU


def make_model(cfg, collect_stats: bool = False, platform: str | None = None) -> Transformer:
  """Builds the model from a full config (model section, data.seq_len and whether norms get
  a frozen divisor, posthoc.remove_norms_every > 0) for devices of
  `platform` (default: ops.platform_of(), the default devices). The platform resolves
  model.attention_kernel='auto' and model.unroll_max_layers=-1 (rolled except on CPU) and
  is kept as model.cfg.platform (sharding.make_plan checks it against the mesh)."""
  platform = platform or ops.platform_of()
  model_cfg = cfg.model.copy_and_resolve_references()
  model_cfg.unlock()
  model_cfg.qk_norm_seq_len = model_cfg.qk_norm_seq_len or cfg.data.seq_len
  model_cfg.platform = platform
  model_cfg.norm_divisors = cfg.posthoc.remove_norms_every > 0  # norm removal (posthoc.ln_free)
  if model_cfg.attention_kernel == 'auto':
    model_cfg.attention_kernel = ops.default_attention_kernel(platform)
  if model_cfg.unroll_max_layers == -1:
    model_cfg.unroll_max_layers = CPU_UNROLL_MAX_LAYERS if platform == 'cpu' else 0
  frozen = ml_collections.FrozenConfigDict(model_cfg)  # hashable: module attributes are static
  return Transformer(frozen, max_len=cfg.data.seq_len, collect_stats=collect_stats)


def scan_inputs(cfg, layer_inputs: dict | None, segments_BxT=None) -> dict:
  """The static per-layer schedule plus the dynamic per-layer inputs (if any) and the
  document ids (broadcast to every layer) of document masking."""
  inputs = {**layer_schedule(cfg), **(layer_inputs or {})}
  if segments_BxT is not None:
    inputs['segments'] = jnp.broadcast_to(segments_BxT, (cfg.num_layers,) + segments_BxT.shape)
  return inputs


def apply_unrolled(model: Transformer, params, tokens_BxT, layer_inputs: dict | None = None):
  """Reference forward pass with a Python loop over layers (tests and benchmarks)."""
  cfg = model.cfg
  carry = model.apply({'params': params}, tokens_BxT, method=lambda m, t: m.start(m.embed(t)))
  schedule, blocks = scan_inputs(cfg, layer_inputs), recurrence.effective_blocks(cfg, params)
  for l in range(cfg.num_layers):
    layer_params = jax.tree.map(lambda p, l=l: p[l], blocks)
    layer = jax.tree.map(lambda s, l=l: s[l], schedule)
    carry, _ = Block(cfg).apply({'params': layer_params}, carry, layer)
  x_BxTxD = model.apply({'params': params}, carry, method=Transformer.finish)
  return model.apply({'params': params}, x_BxTxD, method=Transformer.unembed)


def param_counts(params) -> tuple[int, int]:
  """(total, non-embedding) parameter counts; embeddings, positions and an untied head excluded."""
  total = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
  emb = sum(int(np.prod(params[k].shape)) for k in EMBEDDING_PARAMS if k in params)
  return total, total - emb
