"""Residual-stream designs (`model.residual`), value residuals and the parallel block.

A design says what the scan carry holds, how each residual sublayer reads from and writes
to it, and how the final stream is read out before the final norm. A "residual sublayer"
is one residual add: attention and MLP in the serial block, the fused pair in a parallel
block. A design's connection reads the sublayer input h from the carry and returns it with
a `write(y)` that folds y = step(h) back into the carry; step is the norm placement
(depthscale.blocks) applied to the single stream h, so the update is F(h) = y - h. The
block calls step itself, so the sublayer's parameters stay where the standard block has them.

Every learned scalar or vector whose init is a constant (mixing weights, gates, biases)
is stored as a zero-initialized offset from that init, so the value at init is exact and
weight decay (off by default, `optim.decay_residual`) pulls toward the init. Parameter
modules are named `res_*` (depthscale.model.param_tree.param_kind -> 'residual').

Carry shapes: x_BxTxD, or x_NxBxTxD for the n streams of HC / mHC; sources_SxBxTxD (AttnRes
blocks), dwa_Lp1xBxTxD (DenseFormer history), prev_KxBxTxD (LAuReL-PA), v1_BxTxKxE.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.model.norms import RMSNorm, make_norm
from depthscale.model.placements import Sublayer

Step = Callable[[jax.Array], jax.Array]
Write = Callable[[jax.Array], dict]  # y = step(h) -> the new carry
SINKHORN_EPS = 1e-6  # mHC: added after the softmax and to every Sinkhorn divisor
MHC_GATE_INIT = 0.01  # mHC: alpha_pre/post/res init (spec: from memory, unverified)
MHC_RES_DIAG = 2.0  # mHC: diagonal logit of b_res at init (H_res diagonal ~0.71 for n = 4)
HC_SCALE_INIT = 0.01  # dynamic HC: s_alpha = s_beta at init


def sublayers_per_block(cfg) -> int:
  """Residual adds per block: 2 (attention, MLP) or 1 for a parallel block."""
  return 1 if cfg.parallel_block != 'none' else 2


def _offset(module: nn.Module, name: str, shape: tuple[int, ...]) -> jax.Array:
  return module.param(name, nn.initializers.zeros, shape, jnp.float32)


def depth_connect(mixed_NxBxTxD, h_BxTxD, y_BxTxD, b_N) -> jax.Array:
  """H_out_j = b_j F + H'_j with F = y - h, written so that b = 1 and H'_j = h give y
  bitwise (the HC-at-init = Pre-LN property)."""
  b = b_N.reshape(b_N.shape + (1,) * (mixed_NxBxTxD.ndim - b_N.ndim))
  out = y_BxTxD + (mixed_NxBxTxD - h_BxTxD) + (b - 1) * (y_BxTxD - h_BxTxD)
  return out.astype(mixed_NxBxTxD.dtype)


class Plain(nn.Module):
  """Standard residual: the placement's own update, x <- step(x)."""
  cfg: Any

  def __call__(self, carry: dict, k: jax.Array) -> tuple[jax.Array, Write]:
    return carry['x'], lambda y: {**carry, 'x': y}


class HyperConnection(nn.Module):
  """Hyper-connections (Zhu et al. 2024): n streams, width and depth connections; static
  A_m, A_r, B or dynamic (tanh of the per-stream-normed H, scaled by s_alpha, s_beta)."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict, k: jax.Array) -> tuple[jax.Array, Write]:
    h_NxBxTxD = carry['x']
    n, b_, t_, d = h_NxBxTxD.shape
    a_m = jax.nn.one_hot(k % n, n) + _offset(self, 'a_m', (n,))  # e_{k mod n}
    a_r = jnp.eye(n) + _offset(self, 'a_r', (n, n))
    b = 1.0 + _offset(self, 'b', (n,))
    a_m_NxBxT = jnp.broadcast_to(a_m[:, None, None], (n, b_, t_))
    a_r_NxNxBxT = jnp.broadcast_to(a_r[:, :, None, None], (n, n, b_, t_))
    b_NxBxT = jnp.broadcast_to(b[:, None, None], (n, b_, t_))
    if self.cfg.hc_dynamic:
      w_Dx2pN = _offset(self, 'w', (d, n + 2))  # [W_m | W_r | W_beta]
      s_alpha = HC_SCALE_INIT + _offset(self, 's_alpha', ())
      s_beta = HC_SCALE_INIT + _offset(self, 's_beta', ())
      hbar_NxBxTxD = make_norm(self.cfg, 'norm')(h_NxBxTxD).astype(jnp.float32)
      t_NxBxTx2pN = jnp.tanh(jnp.einsum('nbtd,de->nbte', hbar_NxBxTxD, w_Dx2pN))
      a_m_NxBxT = a_m_NxBxT + s_alpha * t_NxBxTx2pN[..., 0]
      a_r_NxNxBxT = a_r_NxNxBxT + s_alpha * jnp.moveaxis(t_NxBxTx2pN[..., 1:n + 1], -1, 1)
      b_NxBxT = b_NxBxT + s_beta * t_NxBxTx2pN[..., n + 1]
    dt = h_NxBxTxD.dtype
    h_BxTxD = jnp.einsum('nbt,nbtd->btd', a_m_NxBxT.astype(dt), h_NxBxTxD)
    mixed_NxBxTxD = jnp.einsum('ijbt,ibtd->jbtd', a_r_NxNxBxT.astype(dt), h_NxBxTxD)
    b_NxBxT = b_NxBxT.astype(dt)
    return h_BxTxD, lambda y: {**carry, 'x': depth_connect(mixed_NxBxTxD, h_BxTxD, y, b_NxBxT)}


def sinkhorn(logits_NxN: jax.Array, iters: int, eps: float = SINKHORN_EPS) -> jax.Array:
  """Doubly stochastic projection as in the mHC code, in float32: row softmax + eps,
  column-normalize, then (iters - 1) x (row, column) normalization; divisors sum + eps."""
  m = jax.nn.softmax(logits_NxN.astype(jnp.float32), axis=-1) + eps
  col = lambda m: m / (jnp.sum(m, axis=-2, keepdims=True) + eps)
  row = lambda m: m / (jnp.sum(m, axis=-1, keepdims=True) + eps)
  return jax.lax.fori_loop(0, iters - 1, lambda _, m: col(row(m)), col(m))


def _flat_rms_mix(module: nn.Module, x_NxBxTxD, width: int, eps: float) -> jax.Array:
  """(vec(X) phi) * rsqrt(mean(vec(X)^2) + eps) per token: B x T x width, float32."""
  n, b, t, d = x_NxBxTxD.shape
  flat_BxTxND = jnp.moveaxis(x_NxBxTxD, 0, 2).reshape(b, t, n * d).astype(jnp.float32)
  phi = _offset(module, 'phi', (n * d, width))
  scale = jax.lax.rsqrt(jnp.mean(jnp.square(flat_BxTxND), -1, keepdims=True) + eps)
  return jnp.einsum('bte,ew->btw', flat_BxTxND, phi) * scale


def _logit(p: float) -> float:
  return math.log(p / (1 - p))


class ManifoldHyperConnection(nn.Module):
  """mHC (Xie et al. 2025): H_pre = sigma() + eps, H_post = 2 sigma(), H_res = Sinkhorn().
  Init: phi = 0, gates 0.01, b_pre = logit(1/n), b_post = 0, b_res = 2 I, so at init
  sum(H_pre) = 1, H_post = 1 and identical streams stay identical (Pre-LN up to eps)."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict, k: jax.Array) -> tuple[jax.Array, Write]:
    x_NxBxTxD = carry['x']
    n = x_NxBxTxD.shape[0]
    mix_BxTxW = _flat_rms_mix(self, x_NxBxTxD, 2 * n + n * n, self.cfg.norm_eps)
    gate = MHC_GATE_INIT + _offset(self, 'gate', (3,))
    b_pre = _logit(1 / n) + _offset(self, 'b_pre', (n,))
    b_post = _offset(self, 'b_post', (n,))
    b_res = MHC_RES_DIAG * jnp.eye(n) + _offset(self, 'b_res', (n, n))
    pre_BxTxN = jax.nn.sigmoid(gate[0] * mix_BxTxW[..., :n] + b_pre) + SINKHORN_EPS
    post_BxTxN = 2 * jax.nn.sigmoid(gate[1] * mix_BxTxW[..., n:2 * n] + b_post)
    res_logits_BxTxNxN = gate[2] * mix_BxTxW[..., 2 * n:].reshape(mix_BxTxW.shape[:2] + (n, n))
    res_BxTxNxN = sinkhorn(res_logits_BxTxNxN + b_res, self.cfg.mhc_sinkhorn_iters)
    dt = x_NxBxTxD.dtype
    u_BxTxD = jnp.einsum('btn,nbtd->btd', pre_BxTxN.astype(dt), x_NxBxTxD)
    mixed_NxBxTxD = jnp.einsum('btij,ibtd->jbtd', res_BxTxNxN.astype(dt), x_NxBxTxD)
    post_NxBxT = jnp.moveaxis(post_BxTxN, -1, 0).astype(dt)
    return u_BxTxD, lambda y: {**carry, 'x': depth_connect(mixed_NxBxTxD, u_BxTxD, y, post_NxBxT)}


class DepthSoftmax(nn.Module):
  """AttnRes read: softmax_i(w . RMSNorm(v_i)) over the valid sources, no 1/sqrt(d)."""
  cfg: Any

  @nn.compact
  def __call__(self, sources_SxBxTxD, valid_S) -> jax.Array:
    w_D = _offset(self, 'query', (sources_SxBxTxD.shape[-1],))
    keys = RMSNorm(eps=self.cfg.norm_eps, name='key_norm')(sources_SxBxTxD).astype(jnp.float32)
    logits_SxBxT = jnp.einsum('sbtd,d->sbt', keys, w_D)
    logits_SxBxT = jnp.where(valid_S[:, None, None], logits_SxBxT, -jnp.inf)
    p_SxBxT = jax.nn.softmax(logits_SxBxT, axis=0).astype(sources_SxBxTxD.dtype)
    return jnp.einsum('sbt,sbtd->btd', p_SxBxT, sources_SxBxTxD)


def attn_res_blocks(cfg) -> int:
  """N: source blocks of (Block) AttnRes; full AttnRes has one per residual sublayer."""
  subs = cfg.num_layers * sublayers_per_block(cfg)
  return subs if cfg.residual == 'attn_res' else cfg.attn_res_blocks


def attn_res_slot(cfg, k: jax.Array) -> tuple[jax.Array, int]:
  """(n, S): the source slot n (block n, 1-based) that residual sublayer k adds to, and the
  block size S = L_sub // N (the last block takes the remainder)."""
  blocks = attn_res_blocks(cfg)
  size = cfg.num_layers * sublayers_per_block(cfg) // blocks
  return jnp.minimum(k // size, blocks - 1) + 1, size


class AttnResConnection(nn.Module):
  """(Block) AttnRes (Kimi 2026): the sublayer input is a softmax over the embedding and
  the (partial) block sums of earlier sublayer outputs. Slot 0 is the embedding, slot n
  the sum of block n; blocks hold S = L_sub // N sublayers, the last one the remainder."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict, k: jax.Array) -> tuple[jax.Array, Write]:
    sources_SxBxTxD = carry['sources']
    n, size = attn_res_slot(self.cfg, k)
    slot = jnp.arange(sources_SxBxTxD.shape[0])
    valid_S = (slot < n) | ((slot == n) & (k - (n - 1) * size >= 1))
    h_BxTxD = DepthSoftmax(self.cfg, name='read')(sources_SxBxTxD, valid_S)

    def write(y_BxTxD):
      v_BxTxD = y_BxTxD - h_BxTxD  # the raw sublayer output f(h)
      return {**carry, 'sources': sources_SxBxTxD.at[n].add(v_BxTxD), 'x': carry['x'] + v_BxTxD}

    return h_BxTxD, write


class AttnResReadout(nn.Module):
  """AttnRes output layer: a softmax over all sources with its own query and key norm."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict) -> jax.Array:
    sources = carry['sources']
    return DepthSoftmax(self.cfg, name='read')(sources, jnp.ones(sources.shape[0], bool))


class Laurel(nn.Module):
  """LAuReL (Menghani et al. 2025) on one residual add, variant `model.laurel`:
  rw: alpha F + beta x, (alpha, beta) = 2 softmax(logits), logits 0 at init;
  lr: F + x + B A x, A ~ N(0, 1/D), B = 0; rw_lr: alpha F + beta (x + B A x);
  pa: F + x + sum_j gamma_j x_{i-j} over the last `laurel_window` sublayer inputs, gamma = 0."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict, k: jax.Array) -> tuple[jax.Array, Write]:
    cfg, x_BxTxD = self.cfg, carry['x']
    alpha, beta = 1.0, 1.0
    if cfg.laurel in ('rw', 'rw_lr'):
      alpha, beta = 2 * jax.nn.softmax(_offset(self, 'rw_logits', (2,)))
    extra = None  # the x-dependent term added to the skip (LR, PA)
    if cfg.laurel in ('lr', 'rw_lr'):
      d, r = x_BxTxD.shape[-1], cfg.laurel_rank
      a_RxD = self.param('a', nn.initializers.normal(d ** -0.5), (r, d), jnp.float32)
      b_DxR = _offset(self, 'b', (d, r))
      extra = lambda x: jnp.einsum('btr,dr->btd', jnp.einsum('btd,rd->btr', x, a_RxD), b_DxR)
    new = {}
    if cfg.laurel == 'pa':
      prev_KxBxTxD = carry['prev']
      gamma_K = _offset(self, 'gamma', (prev_KxBxTxD.shape[0],))
      extra = lambda x: jnp.einsum('k,kbtd->btd', gamma_K, prev_KxBxTxD)
      new['prev'] = jnp.concatenate([x_BxTxD[None], prev_KxBxTxD[:-1]])

    def write(y_BxTxD):
      # alpha F + beta (x + extra(x)), written so that alpha = beta = 1, extra = 0 give y bitwise
      out = y_BxTxD + (alpha - 1) * (y_BxTxD - x_BxTxD) + (beta - 1) * x_BxTxD
      if extra is not None:
        out = out + beta * extra(x_BxTxD)
      return {**carry, **new, 'x': out.astype(x_BxTxD.dtype)}

    return x_BxTxD, write


class DepthWeightedAverage(nn.Module):
  """DenseFormer DWA after block i (1-based): Y_i = sum_{j in S_i} alpha_ij X_j when
  period | i, S_i = {j <= i : j = i mod dilation}, X_0 the embedding; alpha = e_i at init."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict, index: jax.Array) -> dict:
    cfg = self.cfg
    hist_SxBxTxD = carry['dwa'].at[index].set(carry['x'])
    j = jnp.arange(cfg.num_layers + 1)
    alpha = jax.nn.one_hot(index, cfg.num_layers + 1) + _offset(self, 'alpha', (cfg.num_layers + 1,))
    alpha = jnp.where((j <= index) & ((index - j) % cfg.dwa_dilation == 0), alpha, 0.0)
    y_BxTxD = jnp.einsum('s,sbtd->btd', alpha.astype(hist_SxBxTxD.dtype), hist_SxBxTxD)
    x = jnp.where(index % cfg.dwa_period == 0, y_BxTxD, carry['x'])
    return {**carry, 'x': x, 'dwa': hist_SxBxTxD}


class MeanStreams(nn.Module):
  """HC output: the mean of the n streams (the spec's sum / n: the final norm's eps then
  sees the Pre-LN scale, so HC at init gives the Pre-LN logits)."""
  cfg: Any

  def __call__(self, carry: dict) -> jax.Array:
    return jnp.mean(carry['x'], axis=0)


class ManifoldReadout(nn.Module):
  """mHC output: y = sum_i pre_head_i X_i, pre_head = sigma(alpha_h mix + b_h) + eps;
  phi_h = 0, alpha_h = 0.01, b_h = logit(1/n) at init (y = the mean stream)."""
  cfg: Any

  @nn.compact
  def __call__(self, carry: dict) -> jax.Array:
    x_NxBxTxD = carry['x']
    n = x_NxBxTxD.shape[0]
    mix_BxTxN = _flat_rms_mix(self, x_NxBxTxD, n, self.cfg.norm_eps)
    gate = MHC_GATE_INIT + _offset(self, 'gate', ())
    pre_BxTxN = jax.nn.sigmoid(gate * mix_BxTxN + _logit(1 / n) + _offset(self, 'b', (n,)))
    pre_BxTxN = pre_BxTxN + SINKHORN_EPS
    return jnp.einsum('btn,nbtd->btd', pre_BxTxN.astype(x_NxBxTxD.dtype), x_NxBxTxD)


def _streams(cfg, x_BxTxD) -> dict:
  return {'x': jnp.broadcast_to(x_BxTxD, (cfg.hc_rate,) + x_BxTxD.shape)}


def _attn_res_sources(cfg, x_BxTxD) -> dict:
  zeros = jnp.zeros((attn_res_blocks(cfg),) + x_BxTxD.shape, x_BxTxD.dtype)
  return {'x': x_BxTxD, 'sources': jnp.concatenate([x_BxTxD[None], zeros])}


def _dwa_history(cfg, x_BxTxD) -> dict:
  zeros = jnp.zeros((cfg.num_layers,) + x_BxTxD.shape, x_BxTxD.dtype)
  return {'x': x_BxTxD, 'dwa': jnp.concatenate([x_BxTxD[None], zeros])}


def _laurel_window(cfg, x_BxTxD) -> dict:
  if cfg.laurel != 'pa':
    return {'x': x_BxTxD}
  return {'x': x_BxTxD, 'prev': jnp.zeros((cfg.laurel_window,) + x_BxTxD.shape, x_BxTxD.dtype)}


def _mean_stream(carry: dict) -> jax.Array:
  return jnp.mean(carry['x'], axis=0)


@dataclasses.dataclass(frozen=True)
class History:
  """A carry entry holding earlier outputs in slots [S, B, T, D] that fill in order:
  entering block i (1-based), the slots below open_slot(cfg, i) hold their final values,
  that slot a partial sum (or zeros) and the later slots zeros. The layer scan's backward
  rebuilds it from the final carry (depthscale.model.transformer.history_scan)."""
  key: str  # the carry entry
  open_slot: Callable[[Any, jax.Array], jax.Array]  # (cfg, block index i) -> the open slot


ATTN_RES_HISTORY = History(
    'sources', lambda cfg, i: attn_res_slot(cfg, (i - 1) * sublayers_per_block(cfg))[0])


@dataclasses.dataclass(frozen=True)
class Design:
  """One entry of the table of residual designs."""
  connection: type[nn.Module]  # per residual sublayer: (carry, k) -> (h, write)
  init: Callable[[Any, jax.Array], dict] = lambda cfg, x: {'x': x}  # carry from the embedding
  view: Callable[[dict], jax.Array] = lambda carry: carry['x']  # the stream stats record
  readout: type[nn.Module] | None = None  # carry -> stream before the final norm
  block_end: type[nn.Module] | None = None  # (carry, index) -> carry after the sublayers
  history: History | None = None  # the carry entry of earlier outputs, if any
  plain: bool = False  # the stream is x + F(x) alone: no streams, history, gains or norms of its own


# For HC and mHC the recorded stream is the mean of the n streams (= the Pre-LN stream at
# init); for AttnRes it is the embedding plus all sublayer outputs (the standard sum).
DESIGNS: dict[str, Design] = {
    'standard': Design(Plain, plain=True),
    'hyper_connections': Design(HyperConnection, _streams, _mean_stream, MeanStreams),
    'mhc': Design(ManifoldHyperConnection, _streams, _mean_stream, ManifoldReadout),
    'denseformer': Design(Plain, _dwa_history, block_end=DepthWeightedAverage,
                          history=History('dwa', lambda cfg, i: i)),
    'attn_res': Design(AttnResConnection, _attn_res_sources, readout=AttnResReadout,
                       history=ATTN_RES_HISTORY),
    'block_attn_res': Design(AttnResConnection, _attn_res_sources, readout=AttnResReadout,
                             history=ATTN_RES_HISTORY),
    'laurel': Design(Laurel, _laurel_window),
}
VALUE_RESIDUALS = ('none', 'resformer', 'svformer', 'satformer')
PARALLEL_BLOCKS = ('none', 'gptj', 'neox')
LAURELS = ('rw', 'lr', 'pa', 'rw_lr')


def init_carry(cfg, x_BxTxD) -> dict:
  """The scan carry entering block 1: the design's state, plus V_1 for value residuals."""
  carry = DESIGNS[cfg.residual].init(cfg, x_BxTxD)
  if cfg.value_residual != 'none':
    kv, e = cfg.num_kv_heads or cfg.num_heads, cfg.d_model // cfg.num_heads
    carry['v1'] = jnp.zeros(x_BxTxD.shape[:2] + (kv, e), x_BxTxD.dtype)
  return carry


def mix_values(kind: str, v_BxTxKxE, v1_BxTxKxE, first, gate_BxTxK=None) -> jax.Array:
  """Value residual of layer n >= 2 (layer 1 keeps its V): resformer 0.5 V_1 + 0.5 V_n;
  svformer V_1; satformer V_n + ReLU(h W_alpha) V_1 (gate per token and KV head)."""
  if kind == 'resformer':
    mixed = 0.5 * v1_BxTxKxE + 0.5 * v_BxTxKxE
  elif kind == 'svformer':
    mixed = v1_BxTxKxE
  else:
    mixed = v_BxTxKxE + jax.nn.relu(gate_BxTxK)[..., None] * v1_BxTxKxE
  return jnp.where(first, v_BxTxKxE, mixed.astype(v_BxTxKxE.dtype))


class ValueResidual:
  """The attention hook of one block: mixes V with the carried V_1 and remembers this
  layer's own V, which becomes V_1 in layer 1."""

  def __init__(self, cfg, block: nn.Module, carry: dict, layer: dict):
    self.kind, self.carry, self.first = cfg.value_residual, carry, layer['index'] == 1
    self.own_v = None
    self.w_alpha = None
    if self.kind == 'satformer':
      kv = cfg.num_kv_heads or cfg.num_heads
      init = nn.with_logical_partitioning(nn.initializers.normal(cfg.init_std), ('embed', 'heads'))
      self.w_alpha = block.param('value_gate', init, (cfg.d_model, kv), jnp.float32)

  def __call__(self, v_BxTxKxE, h_BxTxD) -> jax.Array:
    self.own_v = v_BxTxKxE
    gate = None
    if self.w_alpha is not None:
      gate = jnp.einsum('btd,dk->btk', h_BxTxD, self.w_alpha.astype(h_BxTxD.dtype))
    return mix_values(self.kind, v_BxTxKxE, self.carry['v1'], self.first, gate)

  def update(self, carry: dict) -> dict:
    """The carry with V_1 set after layer 1."""
    return {**carry, 'v1': jnp.where(self.first, self.own_v, carry['v1'])}


def parallel_step(attn: Sublayer, mlp: Sublayer, shared_norm: bool, parts: dict) -> Step:
  """GPT-J/PaLM x + Attn(N(x)) + MLP(N(x)) (shared norm) or GPT-NeoX with two norms;
  the two branch outputs are left in `parts` for the recording site."""

  def step(h_BxTxD):
    n_attn = attn.norm('in')(h_BxTxD)
    n_mlp = n_attn if shared_norm else mlp.norm('in')(h_BxTxD)
    parts['attn'], parts['mlp'] = attn.branch(n_attn), mlp.branch(n_mlp)
    return h_BxTxD + parts['attn'] + parts['mlp']

  return step
