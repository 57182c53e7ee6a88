"""Optimizer: AdamW with warmup + schedule, global-norm clipping and a weight-decay mask."""

from __future__ import annotations

import jax
import optax

from depthscale import ngpt
from depthscale.model import EMBEDDING_PARAMS


def schedule(cfg) -> optax.Schedule:
  """Learning rate vs step: linear warmup from 0 to optim.lr, then optim.schedule."""
  o, steps = cfg.optim, cfg.train.steps
  peak, floor = o.lr, o.lr * o.min_lr_ratio
  rest = max(steps - o.warmup_steps, 1)
  if o.schedule == 'constant':
    after = optax.constant_schedule(peak)
  elif o.schedule == 'cosine':
    after = optax.cosine_decay_schedule(peak, rest, alpha=o.min_lr_ratio)
  elif o.schedule == 'linear':
    after = optax.linear_schedule(peak, floor, rest)
  else:  # wsd: warmup, stable, then linear decay over the last decay_fraction of steps
    decay = max(int(round(o.decay_fraction * steps)), 1)
    after = optax.join_schedules(
        [optax.constant_schedule(peak), optax.linear_schedule(peak, floor, decay)],
        [max(rest - decay, 0)])
  warm = optax.linear_schedule(0.0, peak, max(o.warmup_steps, 1))
  return optax.join_schedules([warm, after], [o.warmup_steps])


def param_kind(path) -> str:
  """'embedding', 'residual' (residual-design weights, modules named res_*), 'norm' (gains
  and biases) or 'matrix' for a parameter's tree path."""
  keys = [str(getattr(k, 'key', k)) for k in path]
  if keys[0] in EMBEDDING_PARAMS:
    return 'embedding'
  if any(k.startswith('res_') for k in keys):
    return 'residual'
  if any('norm' in k for k in keys) or keys[-1] in ('scale', 'bias'):
    return 'norm'
  return 'matrix'


def decay_mask(cfg, params):
  """True where AdamW applies weight decay."""
  def decays(path, _):
    kind = param_kind(path)
    return (kind == 'matrix' or (kind == 'norm' and cfg.optim.decay_norms)
            or (kind == 'embedding' and cfg.optim.decay_embeddings)
            or (kind == 'residual' and cfg.optim.decay_residual))
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(cfg) -> optax.GradientTransformation:
  """optax chain: clip by global norm, then AdamW with the schedule and decay mask (then
  nGPT's weight re-normalization)."""
  o = cfg.optim
  adamw = optax.adamw(schedule(cfg), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay,
                      mask=lambda params: decay_mask(cfg, params))
  tx = optax.chain(optax.clip_by_global_norm(o.clip_norm), adamw) if o.clip_norm else adamw
  if cfg.model.block == 'ngpt':  # nGPT: weights back onto the unit sphere after every step
    tx = optax.chain(tx, ngpt.renormalize())
  return tx
