"""Width/depth parametrizations (SP, muP, depth-muP, CompleteP) and init schemes.

One module answers every "how is this parameter scaled" question: its init std, its
Adam learning-rate, weight-decay and epsilon multipliers, the branch and skip
multipliers of a sublayer, the attention-logit scale and the output multiplier.
m_N = d_model / base_d_model (width multiplier), m_L = num_layers / base_num_layers
(depth multiplier); formulas follow CompleteP's Table 1 (Dey et al. 2025) and TP5.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

PARAMETRIZATIONS = ('standard', 'mup', 'depth_mup', 'completep')


@dataclasses.dataclass(frozen=True)
class Init:
  """One row of the init table (model.init): the facts validation reads."""
  scales_skip: bool = False  # multiplies the skip x of x + F(x): needs a plain stream, no parallel block


INITS: dict[str, Init] = {'normal': Init(), 'xavier': Init(), 'small_init': Init(),
                          'depth_scaled': Init(), 'deepnorm': Init(),
                          'deepscalelm': Init(scales_skip=True)}
PLACEMENT_INITS = ('sub_ln', 'simple_norm')  # schemes only a placement's row selects
DEPTH_ALPHA = {'standard': 0.0, 'mup': 0.0, 'depth_mup': 0.5, 'completep': 1.0}
HIDDEN = ('q', 'k', 'v', 'o', 'gate', 'up', 'down')  # block matrices (gate, up: MLP input)
OUTPUT_PROJECTIONS = ('o', 'down')  # matrices writing into the residual stream
DSLM_R0 = 0.221  # DeepScaleLM's data estimate of the input token correlation


def width_mult(cfg) -> float:
  """m_N = d_model / base_d_model (1 when base_d_model is 0)."""
  return cfg.d_model / (cfg.base_d_model or cfg.d_model)


def depth_mult(cfg) -> float:
  """m_L = num_layers / base_num_layers (1 when base_num_layers is 0)."""
  return cfg.num_layers / (cfg.base_num_layers or cfg.num_layers)


def _is_mup(cfg) -> bool:
  return cfg.parametrization != 'standard'


def _alpha(cfg) -> float:
  return DEPTH_ALPHA[cfg.parametrization]


def dslm_beta_lambda(cfg) -> tuple[float, float]:
  """DeepScaleLM's (beta, lambda): beta^2 = 2 / L_sub = 1 / L, lambda^2 + beta^2 = 1."""
  beta_sq = 2.0 / (2 * cfg.num_layers)
  return math.sqrt(beta_sq), math.sqrt(1.0 - beta_sq)


def branch_mult(cfg) -> float:
  """Static multiplier of every sublayer's branch: m_L^-alpha (depth-muP, CompleteP) times
  DeepScaleLM's beta."""
  m = depth_mult(cfg) ** -_alpha(cfg)
  return m * dslm_beta_lambda(cfg)[0] if cfg.init == 'deepscalelm' else m


def skip_mult(cfg) -> float:
  """Multiplier of the residual stream at every sublayer (DeepScaleLM's lambda, else 1)."""
  return dslm_beta_lambda(cfg)[1] if cfg.init == 'deepscalelm' else 1.0


def scale_branch(cfg, branch: Callable, x, dynamic_mult) -> Callable:
  """The branch-multiplier hook: F(h) -> d * (m * F(h) + (lambda - 1) * x).

  m is branch_mult, lambda is skip_mult (so a placement computing x + branch(h) yields
  lambda*x + m*F(h)), d the per-layer dynamic multiplier (ProRes alpha, LayerDrop/LayerSkip
  keep mask; shape () or (B,)). With d = 0 a Pre-LN block is exactly the identity.
  """
  m, lam = branch_mult(cfg), skip_mult(cfg)
  if isinstance(dynamic_mult, (int, float)) and dynamic_mult == 1 and m == 1 and lam == 1:
    return branch

  def scaled(h):
    out = m * branch(h) if lam == 1 else m * branch(h) + (lam - 1.0) * x
    d = jnp.asarray(dynamic_mult, jnp.float32)
    d = d.reshape(d.shape + (1,) * (out.ndim - d.ndim))
    return (out * d).astype(out.dtype)
  return scaled


def attention_scale(cfg) -> float:
  """Logit scale: 1/sqrt(d_h) (SP) or sqrt(d_h_base)/d_h (muP: 1/d_h, equal to SP at base)."""
  e = cfg.d_model // cfg.num_heads
  if not _is_mup(cfg):
    return 1.0 / math.sqrt(e)
  e_base = (cfg.base_d_model or cfg.d_model) // cfg.num_heads
  return math.sqrt(e_base) / e


def logit_mult(cfg) -> float:
  """Output multiplier on the logits: output_mult (/ m_N under the muP family)."""
  return cfg.output_mult / (width_mult(cfg) if _is_mup(cfg) else 1.0)


# ---------------------------------------------------------------- init

def _dslm_vo_std(cfg) -> np.ndarray:
  """DeepScaleLM V and O std per layer: var sqrt(1/r_l)/d, r_l tracked from r_0 = 0.221
  through attention (output correlation 1) and a ReLU FFN, mixed with lambda^2, beta^2."""
  beta, lam = dslm_beta_lambda(cfg)
  r, out = DSLM_R0, []
  for _ in range(cfg.num_layers):
    out.append(math.sqrt(math.sqrt(1.0 / r) / cfg.d_model))
    r = lam ** 2 * r + beta ** 2 * 1.0  # after attention (unit variances throughout)
    relu_r = r + (math.sqrt(max(1.0 - r * r, 0.0)) - r * math.acos(min(r, 1.0))) / math.pi
    r = lam ** 2 * r + beta ** 2 * relu_r  # after the FFN
  return np.asarray(out, np.float32)


def _xavier(fan_in: int, fan_out: int, gain: float) -> float:
  return gain * math.sqrt(2.0 / (fan_in + fan_out))


def _scheme_std(cfg, scheme: str, role: str, fan_in: int, fan_out: int, index):
  """Std of matrix `role` under one init scheme, before the width factor."""
  d, sigma, num_layers = cfg.d_model, cfg.init_std, cfg.num_layers
  hidden = role in HIDDEN
  if scheme == 'xavier' and hidden:  # Glorot & Bengio 2010, as in Xiong et al.'s Post-LN
    return _xavier(fan_in, fan_out, 1.0)
  if scheme == 'small_init':  # Nguyen & Salazar 2019: sqrt(2 / (5 d)) on every matrix
    return math.sqrt(2.0 / (5.0 * d))
  if scheme in ('depth_scaled', 'simple_norm') and role in OUTPUT_PROJECTIONS + (
      ('up',) if scheme == 'simple_norm' else ()):
    return sigma / math.sqrt(2 * num_layers)  # GPT-2; SimpleGPT also on W_up
  if scheme == 'simple_norm' and role in ('embedding', 'head'):  # SimpleGPT: N(0, 1), D^-1/2
    return 1.0 if role == 'embedding' else fan_in ** -0.5
  if scheme == 'deepnorm' and hidden:  # xavier, gain (8L)^-1/4 except on Q and K
    return _xavier(fan_in, fan_out, 1.0 if role in ('q', 'k') else (8.0 * num_layers) ** -0.25)
  if scheme == 'sub_ln' and hidden and role not in ('q', 'k'):  # Magneto: gain sqrt(ln 2L)
    return sigma * math.sqrt(math.log(2 * num_layers))
  if scheme == 'deepscalelm':
    if role in ('embedding', 'pos_embedding'):  # unit variance of the summed embeddings
      return math.sqrt(0.5) if cfg.position == 'learned' else 1.0
    if role in ('q', 'k'):
      return math.sqrt(1.0 / d)
    if role in ('v', 'o'):
      return jnp.asarray(_dslm_vo_std(cfg))[index - 1]
    if hidden:  # FFN: var_1 var_2 d d_ff / 2 = 1 with equal variances
      return (2.0 / (d * (fan_in if role == 'down' else fan_out))) ** 0.25
  return sigma


def init_std(cfg, role: str, fan_in: int, fan_out: int, index=None, scheme: str | None = None):
  """Init std of matrix `role` (q, k, v, o, gate, up, down, embedding, pos_embedding, head)
  under `scheme` (default model.init; a placement passes its own) times the
  parametrization's width factor m_N^-1/2 on hidden matrices; `index` is the traced
  1-based block index."""
  std = _scheme_std(cfg, scheme or cfg.init, role, fan_in, fan_out, index)
  if role in HIDDEN and _is_mup(cfg):
    std = std / math.sqrt(width_mult(cfg))
  return std


def scaled_normal(std) -> Callable:
  """Initializer N(0, std^2) where std may be an array broadcasting to the shape."""
  def init(key, shape, dtype=jnp.float32):
    return (jax.random.normal(key, shape, dtype) * jnp.asarray(std, dtype)).astype(dtype)
  return init


# ---------------------------------------------------------------- optimizer multipliers
# (per group of depthscale.model.param_tree.param_group)

def lr_mult(cfg, group: str) -> float:
  """Adam LR multiplier: hidden matrices m_N^-1 m_L^(alpha-1); hidden gains and biases
  m_L^(alpha-1); embedding, unembedding and final norm 1 (muP: no depth factor)."""
  if not _is_mup(cfg):
    return 1.0
  depth = depth_mult(cfg) ** (_alpha(cfg) - 1.0) if _alpha(cfg) else 1.0
  if group == 'hidden_matrix':
    return depth / width_mult(cfg)
  return depth if group == 'hidden_vector' else 1.0


def wd_mult(cfg, group: str) -> float:
  """AdamW lambda multiplier: m_N on hidden matrices under the muP family, else 1."""
  return width_mult(cfg) if _is_mup(cfg) and group == 'hidden_matrix' else 1.0


def eps_mult(cfg, group: str) -> float:
  """AdamW epsilon multiplier on residual-block parameters: m_N^-1 m_L^-alpha (muP family)."""
  if not _is_mup(cfg) or group not in ('hidden_matrix', 'hidden_vector'):
    return 1.0
  return 1.0 / (width_mult(cfg) * depth_mult(cfg) ** _alpha(cfg))
