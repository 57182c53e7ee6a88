"""LLR: heavy-tail-guided layer-wise learning rates (arXiv 2605.22297).

Per linear module (each layer's q, k, v, o, wi (gate, up), wo): the Hill exponent alpha of
the ESD of W^T W (eigenvalues sigma_k(W)^2, xmin at the median) is mapped linearly from
[min alpha, max alpha] onto [llr_min, llr_max] LR multipliers (lighter tail, larger LR).
Embedding and head take the maximum; norm gains and biases keep 1. Targets are recomputed
every optim.llr_every steps, approached linearly over optim.llr_transition_steps, and
frozen after optim.llr_fraction of training.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from depthscale.model.param_tree import EMBEDDING_PARAMS, FAN_IN_DIMS, block_matrix, path_keys



def hill_alpha(eigs_sorted) -> jax.Array:
  """Hill/MLE tail exponent of ascending eigenvalues (last axis), xmin at the median:
  alpha = 1 + n / sum_{k >= i0} ln(lambda_k / lambda_i0), i0 = N // 2, n = N - i0."""
  n_all = eigs_sorted.shape[-1]
  i0 = n_all // 2
  tail = eigs_sorted[..., i0:]
  logs = jnp.log(jnp.maximum(tail, 1e-30) / jnp.maximum(tail[..., :1], 1e-30))
  return 1.0 + (n_all - i0) / jnp.maximum(jnp.sum(logs, axis=-1), 1e-30)


def _fused(name: str, w) -> bool:
  return name == 'kv' or (name == 'wi' and w.ndim == 4)


def module_matrices(name: str, w):
  """A stacked block weight as (L, S, fan_in, fan_out): S splits fused modules
  (kv -> k, v; SwiGLU wi -> gate, up)."""
  n_in = FAN_IN_DIMS[name]
  if _fused(name, w):  # the fused axis sits right after fan-in
    w = jnp.moveaxis(w, 1 + n_in, 1)
  else:
    w = w[:, None]
  l, s = w.shape[:2]
  fan_in = math.prod(w.shape[2:2 + n_in])
  return w.reshape(l, s, fan_in, -1)


def module_alphas(name: str, w) -> jax.Array:
  """Hill alpha per module of a stacked block weight, shape (L, S)."""
  return hill_alpha(esd(module_matrices(name, w.astype(jnp.float32))))


def esd(w_xMxN) -> jax.Array:
  """Ascending eigenvalues sigma_k(W)^2 of the smaller Gram matrix (last two axes)."""
  if w_xMxN.shape[-2] < w_xMxN.shape[-1]:
    w_xMxN = jnp.swapaxes(w_xMxN, -1, -2)
  gram = jnp.einsum('...mi,...mj->...ij', w_xMxN, w_xMxN, precision='highest')
  # one matrix at a time: XLA-CPU's batched kernel waits on its own tasks in the thread pool
  # every device shares, which deadlocks on a mesh of CPU devices (as in analysis.erank)
  flat = gram.reshape((-1,) + gram.shape[-2:])
  return jax.lax.map(jnp.linalg.eigvalsh, flat).reshape(gram.shape[:-1])


def target_multipliers(cfg, params):
  """LR multiplier per leaf from the current weights (broadcasting against the leaf)."""
  o = cfg.optim
  alphas = jax.tree_util.tree_map_with_path(
      lambda path, w: module_alphas(block_matrix(path), w) if block_matrix(path) else None, params)
  flat = [a.ravel() for a in jax.tree.leaves(alphas)]
  if not flat:
    return jax.tree.map(lambda w: jnp.ones((), jnp.float32), params)
  every = jnp.concatenate(flat)
  lo, hi = jnp.min(every), jnp.max(every)

  def lr(a):
    return o.llr_min + (o.llr_max - o.llr_min) * (a - lo) / jnp.maximum(hi - lo, 1e-12)

  def leaf(path, w):
    name = block_matrix(path)
    if name is None:
      return jnp.asarray(o.llr_max if path_keys(path)[0] in EMBEDDING_PARAMS else 1.0, jnp.float32)
    m = lr(module_alphas(name, w))  # (L, S)
    shape = [w.shape[0]] + [1] * (w.ndim - 1)
    if _fused(name, w):
      shape[1 + FAN_IN_DIMS[name]] = m.shape[1]
      return m.reshape(shape)
    return m[:, 0].reshape(shape)
  return jax.tree_util.tree_map_with_path(leaf, params)


class LlrState(NamedTuple):
  count: jax.Array
  since: jax.Array  # step of the last recompute
  start: optax.Params  # multipliers when the last transition began
  target: optax.Params  # multipliers the transition moves to


def current_multipliers(cfg, state: LlrState):
  """Linear transition from start to target over optim.llr_transition_steps."""
  frac = jnp.clip((state.count - state.since) / max(cfg.optim.llr_transition_steps, 1), 0.0, 1.0)
  return jax.tree.map(lambda a, b: a + (b - a) * frac, state.start, state.target)


def scale_by_llr(cfg) -> optax.GradientTransformation:
  """Scales updates by the LLR multipliers (recomputed from the params every llr_every steps
  while step <= llr_fraction * train.steps)."""
  o = cfg.optim
  last_step = o.llr_fraction * cfg.train.steps

  def init_fn(params):
    shapes = jax.eval_shape(lambda p: target_multipliers(cfg, p), params)
    ones = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
    zero = jnp.zeros([], jnp.int32)
    return LlrState(zero, zero, ones, ones)

  def update_fn(updates, state, params=None):
    now = current_multipliers(cfg, state)
    due = (state.count % o.llr_every == 0) & (state.count <= last_step)
    start, target, since = jax.lax.cond(
        due, lambda: (now, target_multipliers(cfg, params), state.count),
        lambda: (state.start, state.target, state.since))
    state = LlrState(state.count, since, start, target)
    mults = current_multipliers(cfg, state)
    updates = jax.tree.map(lambda u, m: (u * m).astype(u.dtype), updates, mults)
    return updates, LlrState(optax.safe_increment(state.count), since, start, target)

  return optax.GradientTransformation(init_fn, update_fn)

