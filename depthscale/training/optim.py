"""Optimizer: AdamW (optax), or Muon on the matrices and AdamW on the rest, with warmup +
schedule, global-norm clipping, a weight-decay mask and per-parameter LR, weight-decay and
epsilon multipliers."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from depthscale.model import ngpt
from depthscale.model import param_tree
from depthscale.model.placements import PLACEMENTS
from depthscale.model import parametrization as pz
from depthscale.training import dynamics, llr, muon

OPTIMIZERS = ('adamw', 'muon')  # optim.name; muon: Muon on every matrix outside embeddings and head


def schedule(cfg) -> Callable:
  """Learning rate vs step, lr_fn(count, peak=None): linear warmup from 0 to the peak, then
  optim.schedule. The peak is optim.lr, or `peak` (an array: the train step takes the rate as
  an argument, so every rate of a sweep runs one compiled program)."""
  o, steps = cfg.optim, cfg.train.steps
  rest = max(steps - o.warmup_steps, 1)

  def lr_fn(count, peak=None):
    peak = o.lr if peak is None else peak
    floor = peak * o.min_lr_ratio
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
    return optax.join_schedules([warm, after], [o.warmup_steps])(count)

  return lr_fn


def decay_mask(cfg, params):
  """True where AdamW applies weight decay."""
  return jax.tree_util.tree_map_with_path(lambda path, p: _decays(cfg, path, p), params)


def _decays(cfg, path, leaf) -> bool:
  kind = param_tree.param_kind(path, leaf)
  return (kind == 'matrix' or (kind == 'norm' and cfg.optim.decay_norms)
          or (kind == 'embedding' and cfg.optim.decay_embeddings)
          or (kind == 'residual' and cfg.optim.decay_residual))


def _label(cfg, path, leaf) -> str:
  """Optimizer group of a parameter: its parametrization group (Adam) and whether it
  decays; under Muon every matrix is in 'muon/decay' (matrices always decay)."""
  if cfg.optim.name == 'muon' and param_tree.param_kind(path, leaf) == 'matrix':
    return 'muon/decay'
  return param_tree.param_group(path, leaf) + ('/decay' if _decays(cfg, path, leaf) else '')


def _groups(cfg) -> dict[str, optax.GradientTransformation]:
  """Per group: Adam with the group's epsilon, then decoupled decay with its lambda; Muon's
  matrices (only under the standard parametrization, validated) decay with optim.weight_decay."""
  o, m = cfg.optim, cfg.model
  out = {}
  for group in param_tree.GROUPS:
    adam = optax.scale_by_adam(b1=o.b1, b2=o.b2, eps=o.eps * pz.eps_mult(m, group))
    out[group] = adam
    out[group + '/decay'] = optax.chain(
        adam, optax.add_decayed_weights(o.weight_decay * pz.wd_mult(m, group)))
  if o.name == 'muon':
    out['muon/decay'] = optax.chain(muon.muon(o), optax.add_decayed_weights(o.weight_decay))
  return out


def lr_multipliers(cfg, step, params):
  """Per-leaf LR multiplier (arrays broadcasting against the leaf): the parametrization's
  static multiplier times the Q/K slow-down's per-layer factor at `step`."""
  qk = dynamics.qk_slow_factor(cfg, step) if cfg.optim.qk_slow_factor != 1 else None

  def mult(path, p):
    m = pz.lr_mult(cfg.model, param_tree.param_group(path, p))
    keys = param_tree.path_keys(path)
    if qk is None or keys[0] != 'blocks' or keys[-1] not in ('q', 'kv'):
      return jnp.asarray(m, jnp.float32)
    per_layer = qk.reshape((-1,) + (1,) * (p.ndim - 1))
    if keys[-1] == 'kv':  # (L, D, 2, K, E): slow the keys, not the values
      per_layer = jnp.where(jnp.arange(2).reshape(1, 1, 2, 1, 1) == 0, per_layer, 1.0)
    return m * per_layer
  return jax.tree_util.tree_map_with_path(mult, params)


def scale_by_multipliers(mult_fn: Callable) -> optax.GradientTransformation:
  """Scales each leaf's update by mult_fn(count, params) (a tree of broadcasting arrays)."""

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    mults = mult_fn(state.count, params)
    updates = jax.tree.map(lambda u, m: (u * m).astype(u.dtype), updates, mults)
    return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_schedule(lr_fn: Callable) -> optax.GradientTransformationExtraArgs:
  """optax.scale_by_learning_rate(lr_fn) (the same state), with the schedule's peak the extra
  argument `lr` of update (None: lr_fn's own)."""

  def update_fn(updates, state, params=None, *, lr=None, **extra_args):
    del extra_args
    return optax.scale_by_learning_rate(lambda count: lr_fn(count, lr)).update(
        updates, state, params)

  return optax.GradientTransformationExtraArgs(optax.scale_by_learning_rate(lr_fn).init,
                                               update_fn)


def make_optimizer(cfg) -> optax.GradientTransformation:
  """optax chain: clip by global norm; per group Adam (epsilon) or Muon and decoupled weight
  decay (lambda); per-leaf LR multipliers (parametrization, Q/K slow-down, LLR); the schedule
  (its peak: update's extra argument `lr`, else optim.lr); then nGPT's weight re-normalization."""
  o = cfg.optim
  parts = [optax.clip_by_global_norm(o.clip_norm)] if o.clip_norm else []
  parts += [optax.multi_transform(_groups(cfg), lambda params: jax.tree_util.tree_map_with_path(
                lambda path, p: _label(cfg, path, p), params)),
            scale_by_multipliers(lambda step, params: lr_multipliers(cfg, step, params))]
  if o.llr:
    parts.append(llr.scale_by_llr(cfg))
  parts.append(scale_by_schedule(schedule(cfg)))
  if PLACEMENTS[cfg.model.block].unit_sphere:  # nGPT: weights back onto the unit sphere
    parts.append(ngpt.renormalize())
  return optax.chain(*parts)
