"""Tapered MLP widths over depth at a fixed budget (Bayat, Behrouz & Courville 2026, Tapered
Language Models, arXiv 2606.23670), selected by model.mlp_taper.

Block l (1-based) of L gets f_l hidden units, a cosine from r F at block 1 to (2 - r) F at
block L (r = model.mlp_taper_ratio, F the uniform width d_ff):
  w_l = F [(2 - r) + (2r - 2) (1 + cos(pi (l - 1) / (L - 1))) / 2],
whose mean over l is exactly F; f_l rounds w_l so that sum_l f_l = L F (largest remainders).
'reverse' gives block l the width of block L + 1 - l (narrow first: the paper's control).
The paper's exact schedule is RECONSTRUCTED from its abstract and secondary summaries
(cosine taper, best setting 1.5 F to 0.5 F): its method section was not read.

The layer scan needs one parameter shape for every block, so every block holds max_l f_l
units and a static per-block mask zeroes the units j >= f_l after the activation: the
function (and the gradient: inactive rows and columns get none) is that of an MLP of width
f_l. Cost: compute and parameter memory of width max_l f_l in every block (r F: 1.5x the
uniform MLP at r = 1.5); the model's counted parameters are the active units
(transformer.param_counts minus inactive_params).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from depthscale.errors import invalid
from depthscale.model.placements import PLACEMENTS

TAPERS = ('none', 'cosine', 'reverse')  # model.mlp_taper
_UNMASKABLE = frozenset({'mlp_mid', 'linear', 'ngpt'})  # inner norms / scales over the F axis


def uniform_width(cfg) -> int:
  """F: the uniform MLP hidden width (model.d_ff, or mlp_ratio * d_model)."""
  return cfg.d_ff or int(round(cfg.mlp_ratio * cfg.d_model))


def ideal_widths(cfg) -> np.ndarray:
  """w_l (float64, l = 1..L) before rounding; F for every block without a taper."""
  f, n = uniform_width(cfg), cfg.num_layers
  if cfg.mlp_taper == 'none' or n == 1:
    return np.full(n, float(f))
  r = cfg.mlp_taper_ratio
  w = f * ((2 - r) + (2 * r - 2) * (1 + np.cos(math.pi * np.arange(n) / (n - 1))) / 2)
  return w[::-1].copy() if cfg.mlp_taper == 'reverse' else w


def widths(cfg) -> np.ndarray:
  """f_l: integer active widths summing to exactly L F (largest-remainder rounding of w_l)."""
  w = ideal_widths(cfg)
  f = np.floor(w).astype(np.int64)
  short = cfg.num_layers * uniform_width(cfg) - int(f.sum())
  f[np.argsort(f - w, kind='stable')[:short]] += 1
  return f


def param_width(cfg) -> int:
  """The hidden width every block's parameters hold: max_l f_l (F without a taper)."""
  return int(widths(cfg).max())


def mask_hidden(cfg, index, h_BxTxF):
  """h with the units j >= f_index zeroed (index: the traced 1-based block index)."""
  if cfg.mlp_taper == 'none':
    return h_BxTxF
  active_F = jnp.arange(h_BxTxF.shape[-1]) < jnp.asarray(widths(cfg))[index - 1]
  return h_BxTxF * active_F.astype(h_BxTxF.dtype)


def inactive_params(cfg) -> int:
  """Parameters held for masked units: (L max f - L F) D per MLP matrix."""
  matrices = 3 if cfg.mlp == 'swiglu' else 2
  return matrices * cfg.d_model * (cfg.num_layers * param_width(cfg) - int(widths(cfg).sum()))


def check(m) -> None:
  """Raises ConfigError for a taper the model cannot hold (m: the model config)."""
  if m.mlp_taper not in TAPERS:
    raise invalid('model.mlp_taper', m.mlp_taper, 'one of ' + ', '.join(TAPERS))
  if m.mlp_taper == 'none':
    return
  if not 1 <= m.mlp_taper_ratio < 2:
    raise invalid('model.mlp_taper_ratio', m.mlp_taper_ratio,
                  'a number in [1, 2) (first block r F, last (2 - r) F)')
  if PLACEMENTS[m.block].inner & _UNMASKABLE:
    raise invalid('model.mlp_taper', m.mlp_taper,
                  f"'none' with model.block={m.block} (its norms over the MLP width would "
                  'count the masked units)')
  if widths(m).min() < 1:
    raise invalid('model.mlp_taper_ratio', m.mlp_taper_ratio,
                  f'a ratio leaving the last block >= 1 unit (d_ff {uniform_width(m)})')
