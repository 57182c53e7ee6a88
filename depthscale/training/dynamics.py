"""Training-dynamics methods that act through per-layer scan inputs or LR multipliers:
ProRes (progressive residual warmup), BranchNorm's step-dependent exponent, LayerDrop,
LayerSkip's layer dropout and the upper-layer Q/K learning-rate slow-down. Every function is jittable in the step count t
(the number of optimizer updates already applied).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from depthscale.model.placements import PLACEMENTS

PRORES = ('none', 'linear', 'sqrt', 'square', 'equal', 'reverse', 'stagewise', 'fix')
PRORES_VALUES = ('zero', 'inv_L', 'inv_sqrt_L', 'inv_sqrt_l')  # stagewise floor / fix constant
LAYERSKIP_CURRICULA = ('exp', 'none')
_DROP_TAG, _SKIP_TAG = 0x1D, 0x5C  # rng streams of LayerDrop and LayerSkip


def prores_ends(cfg) -> np.ndarray:
  """T_l, the step at which layer l (1..L) finishes warming up: linspace(W // L, W, L),
  all W for 'equal', flipped for 'reverse'."""
  w, n = cfg.train.prores_warmup_steps, cfg.model.num_layers
  if cfg.train.prores == 'equal':
    return np.full(n, float(w))
  ends = np.linspace(w // n, w, n)
  return ends[::-1].copy() if cfg.train.prores == 'reverse' else ends


def _prores_value(cfg) -> np.ndarray:
  """Per-layer floor (stagewise) or constant (fix): 0, 1/L, 1/sqrt(L) or 1/sqrt(l)."""
  n = cfg.model.num_layers
  l = np.arange(1, n + 1, dtype=np.float64)
  return {'zero': np.zeros(n), 'inv_L': np.full(n, 1.0 / n),
          'inv_sqrt_L': np.full(n, 1.0 / math.sqrt(n)), 'inv_sqrt_l': 1.0 / np.sqrt(l)
          }[cfg.train.prores_value]


def prores_alpha(cfg, t) -> jax.Array:
  """alpha_l(t) for l = 1..L (ProRes, Chen et al. 2026); 1 for every layer once t >= W."""
  kind, n = cfg.train.prores, cfg.model.num_layers
  t = jnp.asarray(t, jnp.float32)
  if kind == 'none':
    return jnp.ones(n, jnp.float32)
  ends = jnp.asarray(np.maximum(prores_ends(cfg), 1e-9), jnp.float32)
  if kind == 'fix':
    alpha = jnp.asarray(_prores_value(cfg), jnp.float32)
  elif kind == 'stagewise':
    starts = jnp.concatenate([jnp.zeros(1, jnp.float32), ends[:-1]])
    s = jnp.asarray(_prores_value(cfg), jnp.float32)
    frac = (t - starts) / jnp.maximum(ends - starts, 1e-9)
    alpha = jnp.clip(s + (1 - s) * frac, s, 1.0)
  else:
    ramp = jnp.clip(t / ends, 0.0, 1.0)
    alpha = {'sqrt': jnp.sqrt(ramp), 'square': jnp.square(ramp)}.get(kind, ramp)
  return jnp.where(t >= cfg.train.prores_warmup_steps, 1.0, alpha)


def layerskip_rates(cfg, t) -> jax.Array:
  """LayerSkip's per-layer dropout rate p_l(t) = S(t) D(l) p_max, D(l) = e^(l ln2/(L-1)) - 1
  (l 0-based), S(t) = e^(t ln2/(T-1)) - 1 ('exp' curriculum) or 1 ('none')."""
  n, steps = cfg.model.num_layers, cfg.train.steps
  l = jnp.arange(n, dtype=jnp.float32)
  depth = jnp.exp(l * math.log(2) / max(n - 1, 1)) - 1
  t = jnp.asarray(t, jnp.float32)
  time = (jnp.exp(t * math.log(2) / max(steps - 1, 1)) - 1
          if cfg.train.layerskip_curriculum == 'exp' else 1.0)
  return jnp.clip(time * depth * cfg.train.layerskip_p_max, 0.0, 1.0)


def _uses_branch_mult(cfg) -> bool:
  t = cfg.train
  return t.prores != 'none' or t.layerdrop > 0 or t.layerskip_p_max > 0


def layer_inputs(cfg, t, rng, batch_size: int, train: bool) -> dict | None:
  """Dynamic per-layer scan inputs: 'branch_mult' ((L,) or (L, B)), the product of the
  ProRes alpha and (in training) the LayerDrop / LayerSkip keep masks, and the placement's
  own step-dependent inputs (BranchNorm's 'branchnorm_a' (L,)); None if none are needed."""
  rule = PLACEMENTS[cfg.model.block].step_inputs
  out = rule(cfg, t) if rule else {}
  if _uses_branch_mult(cfg):
    out['branch_mult'] = _branch_mult(cfg, t, rng, batch_size, train)
  return out or None


def _branch_mult(cfg, t, rng, batch_size: int, train: bool) -> jax.Array:
  """ProRes alpha times (in training) the LayerDrop / LayerSkip keep masks."""
  n = cfg.model.num_layers
  mult = prores_alpha(cfg, t)
  if train and cfg.train.layerdrop > 0:  # Fan et al. 2019: one draw per layer per batch
    u = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(rng, _DROP_TAG), t), (n,))
    mult = mult * (u >= cfg.train.layerdrop)
  if train and cfg.train.layerskip_p_max > 0:  # per sample, no rescaling
    u = jax.random.uniform(jax.random.fold_in(jax.random.fold_in(rng, _SKIP_TAG), t), (n, batch_size))
    mult = mult[:, None] * (u >= layerskip_rates(cfg, t)[:, None])
  return mult.astype(jnp.float32)


def qk_slow_factor(cfg, t) -> jax.Array:
  """Per-layer LR factor on W_Q and W_K (length L): c on the upper layers until
  qk_slow_steps, then a linear ramp back to 1 over qk_slow_ramp steps; 1 elsewhere."""
  o, n = cfg.optim, cfg.model.num_layers
  first = o.qk_slow_from_layer or n // 2 + 1
  upper = jnp.arange(1, n + 1) >= first
  t = jnp.asarray(t, jnp.float32)
  ramp = jnp.clip((t - o.qk_slow_steps) / max(o.qk_slow_ramp, 1), 0.0, 1.0)
  if o.qk_slow_ramp == 0:
    ramp = (t >= o.qk_slow_steps).astype(jnp.float32)
  factor = o.qk_slow_factor + (1.0 - o.qk_slow_factor) * ramp
  return jnp.where(upper, factor, 1.0)
