"""Periodic per-layer analyses on a fixed eval batch, and the effective depths they give.

One compiled function runs everything: a scan over the blocks (the same Block
definition and stacked parameters as the model's nn.scan) that returns each block's
output stream, its Jacobian's distance from the identity and its attention entropies, and
carries beside the stream one stream per skipped block (batched); then the logit lens
mapped over layers. Nothing loops over layers in Python or recompiles per layer.

Per-layer metrics (length L, block 1 first; h_l is the raw stream leaving block l (the
residual design's view of its carry), h_0 the embedding, never final-normed unless stated;
p_L is the model's output distribution, after the design's readout):
  angular_distance: arccos(cos(h_{l-1}[T], h_l[T])) / pi on the last token T, mean over
    sequences (Gromov et al. 2024; Curse of Depth, Sun et al. 2025).
  logit_lens_kl: KL(p_l || p_L) with p_l = softmax(W_U FinalNorm(h_l)), mean over tokens:
    the direction of the "What affects effective depth" code, whose ED_KL uses it.
  logit_lens_top5: |top5(p_l) & top5(p_L)| / 5, mean over tokens (same source).
  skip_delta_loss: loss with block l replaced by the identity minus the loss of the full
    model (ShortGPT / Curse of Depth layer removal, on LM loss).
  jacobian_identity_dev: ||J_l v - v|| / ||v|| for one Gaussian v, J_l the Jacobian of
    block l (its whole scan carry) at its input (jvp): 0 when the block is the identity.
  attn_entropy_mean, attn_entropy_min: per head the mean over queries of
    -sum_j a_ij ln a_ij (causal), then the mean and min over heads (Zhai et al. 2023).
  param_rotation: 1 - cos(vec W_l(t), vec W_l(0)) over the block's matrices
    (Carbonnelle & De Vleeschouwer 2019); the init is kept on device.
  erank_weights: mean over the block's matrices of erank(W) = exp(-sum p_k ln p_k),
    p = singular values / their sum (Roy & Vetterli 2007); a matrix is flattened to
    (D, rest) when its first axis is d_model, else to (rest, last axis).
  erank_acts: erank of the mean-centered (tokens x D) matrix of h_l.
skip_delta_loss (a forward pass per layer) and the eranks (SVDs per layer) are computed on
the `sampled` layers only (analysed_layers: every layer up to metrics.analysis_layers,
else that many evenly spaced ones), NaN elsewhere, so that their cost stays bounded at depth.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from depthscale.model import ops, recurrence, residual
from depthscale.model.transformer import Block, Transformer, scan_inputs
from depthscale.training import dynamics, programs
from depthscale.training.sharding import Plan
from depthscale.training.steps import weighted_loss

# metrics.analysis_compile='auto' compiles the analysis at LLVM level 0 ('fast') when a run's
# analyses total at most this many FLOPs, else at level 1 ('light'; ops.CPU_OPT_LEVELS): with
# XLA's loop emitters (ops.REDUCED_LEVEL_OPTIONS) level 0 compiled 1.0-2.5 s faster than level
# 1 and ran 5e-11 to 1.2e-10 s per FLOP slower (2-core host, L2-L256 at d32-d64): up to this
# bound each measured shape's extra run time stayed within the compile it saved
# (benchmarks/NOTES.md, the analysis program's compile, round 3).
FAST_COMPILE_FLOPS = 1e10
PROBE_PASSES = 2  # whole-model block passes of the probe scan: the forward (shared with the jvp)
#                   and the jvp's transposed backward
KL_THRESHOLD = 0.5  # tau of ED_KL (the "What affects" table uses 0.5)
OVERLAP_THRESHOLD = 0.3  # ED_overlap threshold (same source)
SKIP_FRACTION = 0.9  # effective_depth/skip: share of the summed skip losses
_TINY = 1e-30


def angular_distance(h_prev_BxTxD, h_BxTxD) -> jax.Array:
  """arccos(cos) / pi between two streams on the last token, mean over sequences; the
  angle is 2 atan2(|u - w|, |u + w|) for unit vectors u, w (exactly 0 when equal)."""
  unit = lambda x: x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), _TINY)
  u, w = unit(h_prev_BxTxD[:, -1].astype(jnp.float32)), unit(h_BxTxD[:, -1].astype(jnp.float32))
  angle = 2 * jnp.arctan2(jnp.linalg.norm(u - w, axis=-1), jnp.linalg.norm(u + w, axis=-1))
  return jnp.mean(angle / jnp.pi)


def erank(m_NxM) -> jax.Array:
  """Effective rank exp(H(p)), p = singular values normalized to sum 1 (0 for a zero matrix).

  A stack of matrices goes through the SVD one at a time: XLA-CPU's batched SVD kernel waits
  on its own batch's tasks in the thread pool that every device of the process shares, which
  deadlocks once all devices run it at once."""
  m = m_NxM.astype(jnp.float32)
  flat = m.reshape((-1,) + m.shape[-2:])
  s = jax.lax.map(lambda x: jnp.linalg.svd(x, compute_uv=False), flat).reshape(m.shape[:-2] + (-1,))
  total = jnp.sum(s, axis=-1, keepdims=True)
  p = s / jnp.maximum(total, _TINY)
  h = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)
  return jnp.where(total[..., 0] > 0, jnp.exp(h), 0.0)


def eranks_by_shape(mats_KxNxM: list) -> list[jax.Array]:
  """erank of each stack of matrices, in order; the stacks of one shape go through one erank
  call (one SVD loop per shape, not per stack: a smaller program to compile)."""
  groups: dict[tuple, list[int]] = {}
  for i, m in enumerate(mats_KxNxM):
    groups.setdefault(m.shape, []).append(i)
  out: list = [None] * len(mats_KxNxM)
  for members in groups.values():
    for i, e in zip(members, erank(jnp.stack([mats_KxNxM[i] for i in members]))):
      out[i] = e
  return out


def as_matrix(w_Lx, d_model: int):
  """Per-layer weights (leading L axis) as L matrices: (D, rest) or (rest, last axis)."""
  if w_Lx.shape[1] == d_model:
    return w_Lx.reshape(w_Lx.shape[0], d_model, -1)
  return w_Lx.reshape(w_Lx.shape[0], -1, w_Lx.shape[-1])


def logit_lens(log_p_VxT, log_p_final_VxT):
  """(KL(p || p_final), top-5 overlap) for log-probabilities over the last axis, token means."""
  kl = jnp.sum(jnp.exp(log_p_VxT) * (log_p_VxT - log_p_final_VxT), axis=-1)
  top = jax.lax.top_k(log_p_VxT, 5)[1]
  top_final = jax.lax.top_k(log_p_final_VxT, 5)[1]
  overlap = jnp.sum(top[..., :, None] == top_final[..., None, :], axis=(-1, -2)) / 5.0
  return jnp.mean(kl), jnp.mean(overlap)


def evenly_spaced(num_layers: int, count: int) -> list[int]:
  """0-based layers: all when count is 0 or >= num_layers, else `count` evenly spaced ones,
  first and last included."""
  if not count or num_layers <= count:
    return list(range(num_layers))
  return sorted({int(round(v)) for v in np.linspace(0, num_layers - 1, count)})


def analysed_layers(cfg) -> list[int]:
  """0-based layers of a rung's skip_delta_loss and eranks (metrics.analysis_layers)."""
  return evenly_spaced(cfg.model.num_layers, cfg.metrics.analysis_layers)


def analysis_count(steps: int, every: int) -> int:
  """How many analyses a run of `steps` steps makes (every `every` steps and at the last)."""
  return len(set(range(0, steps, every)) | {steps - 1}) if every else 0


def analysis_flops(cfg, compute_params: int) -> float:
  """Forward FLOPs of one analysis: per analysed token, the probe scan's PROBE_PASSES and
  the K skip passes through the model's compute_params non-embedding parameters (2 FLOPs
  each, plus causal attention's 4 T D per layer), and the L + 1 + K unembeddings (logit
  lens, output, skips).
  The SVDs are library calls: no compile setting changes their cost."""
  m, t = cfg.model, cfg.data.seq_len
  k = len(analysed_layers(cfg))
  block = 2 * compute_params + 4 * t * m.d_model * m.num_layers
  head = 2 * m.d_model * m.vocab_size
  return cfg.metrics.analysis_batch_size * t * ((PROBE_PASSES + k) * block +
                                                (m.num_layers + 1 + k) * head)


def compile_mode(cfg, compute_params: int) -> str:
  """metrics.analysis_compile with 'auto' resolved: 'fast' when the run's analyses total at
  most FAST_COMPILE_FLOPS, else 'light' (a key of ops.CPU_OPT_LEVELS)."""
  mode = cfg.metrics.analysis_compile
  if mode != 'auto':
    return mode
  runs = analysis_count(cfg.train.steps, cfg.metrics.analysis_every)
  return 'fast' if runs * analysis_flops(cfg, compute_params) <= FAST_COMPILE_FLOPS else 'light'


def gaussian_like(key, tree):
  """A standard Gaussian draw shaped and typed as each leaf of tree (one key per leaf)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef.unflatten([jax.random.normal(k, a.shape, jnp.float32).astype(a.dtype)
                            for k, a in zip(jax.random.split(key, len(leaves)), leaves)])


def make_analysis_fn(model: Transformer, full_cfg=None,
                     sampled: list[int] | None = None) -> Callable[..., dict]:
  """(params, batch, key, step) -> per-layer analyses (length-L arrays), jittable as one
  function. With full_cfg (the whole config) the blocks run as eval runs them at `step`:
  the step's per-layer inputs (ProRes alpha, BranchNorm's a_t; no drops). sampled: the
  0-based layers of skip_delta_loss and the eranks (default all; NaN elsewhere)."""
  cfg = model.cfg
  idx = np.arange(cfg.num_layers) if sampled is None else np.asarray(sampled)
  on_layers = lambda v_K: jnp.full((cfg.num_layers,), jnp.nan, v_K.dtype).at[idx].set(v_K)
  block, stat_block = Block(cfg), Block(cfg, collect_stats=True)
  view = residual.DESIGNS[cfg.residual].view  # the one stream of a residual design's carry

  def run_block(p_l, carry, layer):
    return block.apply({'params': p_l}, carry, layer)[0]

  def probe(carry, xs):
    """One block on the clean forward: output stream, jvp test, entropies, Csordas cosines."""
    p_l, layer, v = xs

    def stat_apply(c):  # the statistics' forward is the jvp's: one forward pass, not two
      (out, stats), sown = stat_block.apply({'params': p_l}, c, layer, mutable=['analysis'])
      return out, (stats, sown)
    out, jv, (stats, sown) = ops.jvp(stat_apply, carry, v, has_aux=True)
    sq = lambda t: sum(jnp.sum(jnp.square(a.astype(jnp.float32))) for a in jax.tree.leaves(t))
    dev = jnp.sqrt(sq(jax.tree.map(jnp.subtract, jv, v)) / sq(v))
    ent_H = jnp.concatenate([jnp.ravel(e) for e in jax.tree.leaves(sown['analysis'])])
    return out, {'x_out': view(out), 'jacobian_identity_dev': dev,
                 'attn_entropy_mean': jnp.mean(ent_H), 'attn_entropy_min': jnp.min(ent_H),
                 'cos_mean': (stats['attn_cos'] + stats['mlp_cos'] + stats['update_cos']) / 3}

  def apply(params, *args, method):
    return model.apply({'params': params}, *args, method=method)

  def layer(carries, xs):
    """Block l on the clean stream (the probe) and on the K skip streams batched (K b <= L B
    rows: no larger than a train step's forward); skip stream k keeps its whole carry at
    block idx[k], which it skips. One loop over the blocks for both."""
    carry, skips = carries
    p_l, layer_in, v, l = xs
    out, per = probe(carry, (p_l, layer_in, v))
    new = jax.vmap(lambda c: run_block(p_l, c, layer_in))(skips)
    kept = lambda n, o: jnp.where((jnp.asarray(idx) == l).reshape((-1,) + (1,) * (n.ndim - 1)), o, n)
    return (out, jax.tree.map(kept, new, skips)), per

  def analyse(params, batch, key, step=0) -> dict:
    inputs = None if full_cfg is None else dynamics.layer_inputs(
        full_cfg, step, jax.random.PRNGKey(0), batch['inputs'].shape[0], False)
    schedule = scan_inputs(cfg, inputs, batch.get('segments'))  # + document ids when masking
    carry0 = apply(params, apply(params, batch['inputs'], method=Transformer.embed),
                   method=Transformer.start)
    # the jvp's Gaussian v per layer, drawn before the scan: drawn inside it, XLA fused the
    # draw into each of v's consumers (6 copies of erf_inv at L2)
    vs = jax.vmap(lambda k: gaussian_like(k, carry0))(jax.random.split(key, cfg.num_layers))
    blocks = recurrence.effective_blocks(cfg, params)  # per effective layer under recurrence
    skips0 = jax.tree.map(lambda a: jnp.broadcast_to(a, (len(idx),) + a.shape), carry0)
    (carry, skips), per = jax.lax.scan(layer, (carry0, skips0),
                                       (blocks, schedule, vs, jnp.arange(cfg.num_layers)))
    h_LxBxTxD = per.pop('x_out')
    h_prev = jnp.concatenate([view(carry0)[None], h_LxBxTxD[:-1]])
    log_softmax = lambda h: jax.nn.log_softmax(apply(params, h, method=Transformer.unembed), axis=-1)

    def readout(c):  # the model's logits and loss from a stream's final carry
      logits = apply(params, apply(params, c, method=Transformer.finish),
                     method=Transformer.unembed)
      return logits, weighted_loss(logits, batch)
    # the full model (row 0) and the K skip streams in one batched readout
    logits_1K, loss_1K = jax.vmap(readout)(jax.tree.map(
        lambda c, s: jnp.concatenate([c[None], s]), carry, skips))
    log_p_final = jax.nn.log_softmax(logits_1K[0], axis=-1)
    kl, top5 = jax.lax.map(lambda h: logit_lens(log_softmax(h), log_p_final), h_LxBxTxD)
    acts = h_LxBxTxD[idx].reshape(len(idx), -1, h_LxBxTxD.shape[-1]).astype(jnp.float32)
    mats = [as_matrix(w[idx], cfg.d_model) for w in jax.tree.leaves(blocks) if w.ndim >= 3]
    return {**per,
            'angular_distance': jax.vmap(angular_distance)(h_prev, h_LxBxTxD),
            'logit_lens_kl': kl, 'logit_lens_top5': top5,
            'skip_delta_loss': on_layers(loss_1K[1:] - loss_1K[0]),
            'erank_acts': on_layers(erank(acts - jnp.mean(acts, axis=1, keepdims=True))),
            'erank_weights': on_layers(sum(eranks_by_shape(mats)) / len(mats))}

  return analyse


def param_rotation(blocks, init_blocks) -> jax.Array:
  """Per layer 1 - cos(vec W(t), vec W(0)) over the matrices (ndim >= 3 with the layer axis),
  as |u - u0|^2 / 2 of the unit vectors: no cancellation near the init."""
  mats = [(w.astype(jnp.float32), w0.astype(jnp.float32)) for w, w0 in
          zip(jax.tree.leaves(blocks), jax.tree.leaves(init_blocks)) if w.ndim >= 3]
  per_layer = lambda x: jnp.sum(x, axis=tuple(range(1, x.ndim)))
  as_layers = lambda n, w: n.reshape((-1,) + (1,) * (w.ndim - 1))
  norm = lambda i: jnp.maximum(jnp.sqrt(sum(per_layer(jnp.square(m[i])) for m in mats)), _TINY)
  n, n0 = norm(0), norm(1)
  return sum(per_layer(jnp.square(w / as_layers(n, w) - w0 / as_layers(n0, w0)))
             for w, w0 in mats) / 2


def ed_cos(cos_mean: np.ndarray) -> float:
  """effective_depth/cos (What affects effective depth, calc_ed_cosine_similarity): the last
  0-based l with mean(attn_cos, mlp_cos, update_cos)[l] < 0 <= [l+1]; NaN if none."""
  hits = [l for l in range(len(cos_mean) - 1) if cos_mean[l] < 0 <= cos_mean[l + 1]]
  return float(hits[-1]) if hits else float('nan')


def ed_kl(kl: np.ndarray, tau: float = KL_THRESHOLD) -> float:
  """effective_depth/kl (same source, calc_ed_logitlens_kl with tau 0.5): the first 0-based
  l < L-1 with KL_l < tau * max KL; L-1 if none (only the last layer, where KL = 0)."""
  hits = [l for l in range(len(kl) - 1) if kl[l] < tau * np.max(kl)]
  return float(hits[0]) if hits else float(len(kl) - 1)


def ed_overlap(top5: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> float:
  """effective_depth/overlap (same source, calc_ed_logitlens_overlap with 0.3): the first
  0-based l < L-1 whose top-5 overlap with the final layer exceeds 0.3; L-1 if none."""
  hits = [l for l in range(len(top5) - 1) if top5[l] > threshold]
  return float(hits[0]) if hits else float(len(top5) - 1)


def ed_skip(skip_delta: np.ndarray, fraction: float = SKIP_FRACTION) -> float:
  """effective_depth/skip (ours; ShortGPT-style removal): the fewest blocks, taken by
  decreasing skip_delta_loss, whose positive loss increases sum to 90% of the total of
  positive increases: the layers the loss needs. 0 if no block's removal hurts."""
  gains = np.sort(np.clip(skip_delta, 0.0, None))[::-1]
  total = gains.sum()
  if total <= 0:
    return 0.0
  return float(np.searchsorted(np.cumsum(gains), fraction * total - 1e-12 * total) + 1)


def effective_depths(per_layer: dict[str, np.ndarray]) -> dict[str, float]:
  """effective_depth/<kind> and its ratio to L: (ED + 1) / L for the 0-based index kinds
  (cos, kl, overlap), ED / L for skip (a count). With skip_delta_loss on K < L layers (NaN
  elsewhere), skip_ratio is the count over the K analysed layers / K and skip is L times it."""
  n = len(per_layer['skip_delta_loss'])
  eds = {'cos': ed_cos(per_layer['cos_mean']), 'kl': ed_kl(per_layer['logit_lens_kl']),
         'overlap': ed_overlap(per_layer['logit_lens_top5'])}
  out = {f'effective_depth/{k}': v for k, v in eds.items()}
  out.update({f'effective_depth/{k}_ratio': (v + 1) / n for k, v in eds.items()})
  skip = per_layer['skip_delta_loss'][~np.isnan(per_layer['skip_delta_loss'])]
  out['effective_depth/skip_ratio'] = ed_skip(skip) / len(skip)
  out['effective_depth/skip'] = out['effective_depth/skip_ratio'] * n
  return out


def _analysis_program(model: Transformer, full_cfg, sampled: list[int] | None,
                      rows: int) -> Callable[..., dict]:
  """(params, init_blocks, batch, key, step) -> make_analysis_fn's analyses on the batch's first
  `rows` rows, and param_rotation against init_blocks."""
  analyse = make_analysis_fn(model, full_cfg, sampled)

  def run(params, init_blocks, batch, key, step):
    per = analyse(params, jax.tree.map(lambda a: a[:rows], batch), key, step)
    rotation = param_rotation(params['blocks'], init_blocks)  # of the shared blocks
    return {**per, 'param_rotation': recurrence.per_effective_layer(model.cfg, rotation)}

  return run


class Analyzer:
  """The analyses compiled for the rung's plan (its shardings and context, outputs
  replicated: readable on every process) on the first rows of a fixed batch; keeps the
  initial block weights on device, sharded as the parameters. sampled as in
  make_analysis_fn (default all); opt_level: the CPU program's LLVM optimization level
  (ops.CPU_OPT_LEVELS of compile_mode; None: XLA's default)."""

  def __init__(self, model: Transformer, plan: Plan, init_blocks, batch: dict, rows: int,
               seed: int, full_cfg=None, sampled: list[int] | None = None,
               opt_level: int | None = None):
    self.init_blocks, self.batch, self.key = init_blocks, batch, jax.random.PRNGKey(seed)
    build = lambda: _analysis_program(model, full_cfg, sampled, rows)
    run = build() if full_cfg is None else programs.kept(  # an earlier rung's: its program
        full_cfg, ('analysis', model, None if sampled is None else tuple(sampled), rows), build)
    params = plan.state['params']
    self.fn = plan.compile(run, (params, params['blocks'], plan.batch, plan.replicated,
                                 plan.replicated),
                           plan.replicated, plan.abstract_state['params'], init_blocks, batch,
                           self.key, jax.ShapeDtypeStruct((), jnp.int32), opt_level=opt_level)

  def __call__(self, params, step=0) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(per-layer metrics as lists, block 1 first; effective-depth scalars) of the model as
    trained at `step` (the number of updates applied to params)."""
    per = jax.device_get(self.fn(params, self.init_blocks, self.batch, self.key,
                                 jnp.asarray(step, jnp.int32)))
    per = {k: np.asarray(v, np.float64) for k, v in per.items()}
    scalars = effective_depths(per)
    del per['cos_mean']  # the mean of three logged statistics, used for ED_cos only
    return {k: [float(x) for x in v] for k, v in per.items()}, scalars
