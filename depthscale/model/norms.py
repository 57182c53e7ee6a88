"""Norm functions, selected by `model.norm`; each is a module over the last axis.

make_norm builds the configured one for a position ('attn', 'mlp' or 'final'): DyT,
Derf and BHyT take their initial alpha (lambda) from that position.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.errors import invalid
from depthscale.model import ops
from depthscale.model.stats import record_saturation
from depthscale.model.tables import rows_with


def _param(module: nn.Module, name: str, init, size: int, axis: str):
  return module.param(name, nn.with_logical_partitioning(init, (axis,)), (size,), jnp.float32)


def _scalar(module: nn.Module, name: str, value: float):
  return module.param(name, nn.initializers.constant(value), (), jnp.float32)


def l2_normalize(x, axis: int = -1, eps: float = 1e-12):
  """x / ||x||_2 along axis (in float32, cast back); eps only guards a zero vector."""
  x32 = x.astype(jnp.float32)
  norm = jnp.sqrt(jnp.sum(jnp.square(x32), axis=axis, keepdims=True))
  return (x32 / jnp.maximum(norm, eps)).astype(x.dtype)


def _rms(x32, eps: float):
  return jnp.sqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)


def _standardize_or_fixed(module: nn.Module, x32, eps: float, center: bool):
  """ops.standardize(x) or, once the module's frozen divisor c is set (c > 0; norm removal by
  fine-tuning, Heimersheim 2024, depthscale.posthoc.ln_free), the linear (x - mean(x)) / c
  (x / c without centering); c starts at 0, the live norm, and gets no gradient. The mean
  over tokens of the input's sqrt(var + eps) is sown as 'input_std', the value c freezes."""
  y = ops.standardize(x32, eps, center)
  if not module.divisor:
    return y
  c = jax.lax.stop_gradient(_scalar(module, 'divisor', 0.0))
  xc = x32 - x32.mean(-1, keepdims=True) if center else x32
  module.sow('intermediates', 'input_std', jnp.mean(jnp.sqrt(jnp.mean(jnp.square(xc), -1) + eps)))
  return jnp.where(c > 0, xc / jnp.where(c > 0, c, 1.0), y)


def _affine(module: nn.Module, y, use_scale: bool, use_bias: bool, axis: str):
  """g * y (+ b): gain g init 1, bias b init 0, each only when asked."""
  d = y.shape[-1]
  if use_scale:
    y = y * _param(module, 'scale', nn.initializers.ones, d, axis)
  if use_bias:
    y = y + _param(module, 'bias', nn.initializers.zeros, d, axis)
  return y


class LayerNorm(nn.Module):
  """LN(x) = g * (x - mean) / sqrt(var + eps) + b; g starts at 1, b at 0."""
  eps: float = 1e-5
  axis: str = 'embed'
  use_scale: bool = True  # False: no gain (LayerRoPE supplies it)
  divisor: bool = False  # a frozen divisor c that replaces the std once set (norm removal)

  @nn.compact
  def __call__(self, x):
    y = _standardize_or_fixed(self, x.astype(jnp.float32), self.eps, True)
    return _affine(self, y, self.use_scale, True, self.axis).astype(x.dtype)


class RMSNorm(nn.Module):
  """RMSNorm(x) = g * x / sqrt(mean(x^2) + eps) (+ b with model.norm_bias); g starts at 1."""
  eps: float = 1e-5
  axis: str = 'embed'
  use_scale: bool = True  # False: no gain (LayerRoPE supplies it)
  use_bias: bool = False  # LayerNorm's bias b, init 0 (a Pre-LN model converted keeps its own)
  divisor: bool = False  # a frozen divisor c that replaces the rms once set (norm removal)

  @nn.compact
  def __call__(self, x):
    y = _standardize_or_fixed(self, x.astype(jnp.float32), self.eps, False)
    return _affine(self, y, self.use_scale, self.use_bias, self.axis).astype(x.dtype)


class CRMSNorm(nn.Module):
  """CRMSNorm (Jiang et al. 2023, arXiv 2305.14858) on a stream holding the compressed
  zero-mean vector: x[:D-1] = c stands for z = [c, -sum(c)] (mean 0), x[D-1] is ignored.

  CRMSNorm(c) = c / sqrt((sum c_i^2 + (sum c_i)^2) / D + eps) = RMSNorm(z)[:D-1]; the output
  is decompressed, g * [n, -sum(n)] (+ b), so the following matrices keep their D inputs (the
  paper folds this into W[:D-1] - W[D-1], the same product). The D-wide stream keeps the
  discarded slot: no compute is saved here (the paper saves 1/D).
  """
  eps: float = 1e-5
  axis: str = 'embed'
  use_bias: bool = False

  @nn.compact
  def __call__(self, x):
    c = x[..., :-1].astype(jnp.float32)
    total = c.sum(-1, keepdims=True)
    r = jax.lax.rsqrt((jnp.square(c).sum(-1, keepdims=True) + jnp.square(total)) / x.shape[-1]
                      + self.eps)
    y = jnp.concatenate([c * r, -total * r], axis=-1)
    return _affine(self, y, True, self.use_bias, self.axis).astype(x.dtype)


class SingleScaleRMSNorm(nn.Module):
  """Single-Scale RMSNorm (Park et al. 2025, OSP): s * x / sqrt(mean(x^2) + eps) with one
  learnable scalar s (init 1) instead of a per-channel gain, so no channel is amplified."""
  eps: float = 1e-5
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    y = ops.standardize(x.astype(jnp.float32), self.eps, False) * _scalar(self, 'scale', 1.0)
    return y.astype(x.dtype)


class ScaleNorm(nn.Module):
  """ScaleNorm (Nguyen & Salazar 2019): g * x / max(||x||_2, eps); scalar g starts at sqrt(d)."""
  eps: float = 1e-5
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    g = _scalar(self, 'scale', math.sqrt(x.shape[-1]))
    norm = jnp.sqrt(jnp.sum(jnp.square(x32), -1, keepdims=True))
    return (g * x32 / jnp.maximum(norm, self.eps)).astype(x.dtype)


class DyT(nn.Module):
  """DyT (Zhu et al. 2025): g * tanh(alpha * x) + b; scalar alpha starts at alpha0.

  Keeps the bias b of the general form (the LLaMA variant drops it).
  """
  alpha0: float = 1.0
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    u = jnp.tanh(_scalar(self, 'alpha', self.alpha0) * x.astype(jnp.float32))
    record_saturation(self, u)
    y = u * _param(self, 'scale', nn.initializers.ones, d, self.axis)
    return (y + _param(self, 'bias', nn.initializers.zeros, d, self.axis)).astype(x.dtype)


class Derf(nn.Module):
  """Derf (Chen et al. 2025): g * erf(alpha * x + s) + b; alpha starts at alpha0, s at 0."""
  alpha0: float = 1.0
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    z = _scalar(self, 'alpha', self.alpha0) * x.astype(jnp.float32) + _scalar(self, 'shift', 0.0)
    u = jax.scipy.special.erf(z)
    record_saturation(self, u)
    y = u * _param(self, 'scale', nn.initializers.ones, d, self.axis)
    return (y + _param(self, 'bias', nn.initializers.zeros, d, self.axis)).astype(x.dtype)


class BHyT(nn.Module):
  """BHyT-star (Byun et al. 2026), exact per-norm statistics:
  g * tanh(lambda * x / (kappa * sqrt(mean(x^2) + 1e-6))); lambda starts at alpha0."""
  alpha0: float = 2.0
  kappa: float = 10.0
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    lam = _scalar(self, 'lambda', self.alpha0)
    y = jnp.tanh(lam * x32 / (self.kappa * _rms(x32, 1e-6)))
    return (y * _param(self, 'scale', nn.initializers.ones, x.shape[-1], self.axis)).astype(x.dtype)


class SeeDNorm(nn.Module):
  """SeeDNorm (Cai et al. 2025): [tanh(x . beta) * alpha + g] * x / RMS(x).

  UNVERIFIED inits (no official code): g = 1, alpha = 1, beta = 0, so the norm is
  RMSNorm at init and both alpha and beta receive gradient.
  """
  eps: float = 1e-5
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x32 = x.astype(jnp.float32)
    beta = _param(self, 'beta', nn.initializers.zeros, d, self.axis)
    alpha = _param(self, 'alpha', nn.initializers.ones, d, self.axis)
    gain = jnp.tanh(x32 @ beta)[..., None] * alpha + _param(self, 'scale', nn.initializers.ones,
                                                              d, self.axis)
    return (gain * x32 / _rms(x32, self.eps)).astype(x.dtype)


class Identity(nn.Module):
  """No norm (norm-free studies): returns x."""
  axis: str = 'embed'

  def __call__(self, x):
    return x


@dataclasses.dataclass(frozen=True)
class Norm:
  """One row of the norm table (model.norm): its module and the switches it composes with."""
  module: type[nn.Module]
  bias: bool = False  # takes model.norm_bias: a learnable bias after the gain, as LayerNorm has
  layer_rope: bool = False  # a per-feature gain that model.layer_rope replaces with its own
  removable: bool = False  # a frozen divisor can replace it (posthoc.remove_norms_every)
  scales_embedding: bool = False  # norm-free: x_0 = s E[tok], a learnable s from sqrt(D)


NORMS: dict[str, Norm] = {
    'layernorm': Norm(LayerNorm, layer_rope=True, removable=True),
    'rmsnorm': Norm(RMSNorm, bias=True, layer_rope=True, removable=True),
    'crmsnorm': Norm(CRMSNorm, bias=True),
    'scalenorm': Norm(ScaleNorm),
    'dyt': Norm(DyT, scales_embedding=True),
    'derf': Norm(Derf, scales_embedding=True),
    'bhyt': Norm(BHyT),
    'seednorm': Norm(SeeDNorm),
    'none': Norm(Identity),
    'ss_rmsnorm': Norm(SingleScaleRMSNorm),
}
# model fields that a norm takes only where its row has the fact
OPTIONS = {'norm_bias': 'bias', 'layer_rope': 'layer_rope'}


def check_options(m) -> None:
  """Raises ConfigError for a switched-on model field that model.norm's row does not take."""
  for field, fact in OPTIONS.items():
    if m[field] and not getattr(NORMS[m.norm], fact):
      raise invalid(f'model.{field}', m[field],
                    f'False unless model.norm in {", ".join(rows_with(NORMS, fact))}')


POSITIONS = ('attn', 'mlp', 'final')


def _alpha0(cfg, position: str) -> float:
  if cfg.norm == 'bhyt':
    return cfg.bhyt_lambda_in if position == 'attn' else cfg.bhyt_lambda_post
  return {'attn': cfg.norm_alpha_attn, 'mlp': cfg.norm_alpha_mlp,
          'final': cfg.norm_alpha_final}[position]


def make_norm(cfg, name: str, axis: str = 'embed', position: str = 'attn',
              use_scale: bool = True) -> nn.Module:
  """Builds the configured norm (cfg is the model config) as a submodule called `name`.

  BHyT's final norm stays RMSNorm (lambda_last = 0 in the authors' sweeps).
  """
  kind = 'rmsnorm' if cfg.norm == 'bhyt' and position == 'final' else cfg.norm
  divisor = cfg.get('norm_divisors', False)  # norm removal (depthscale.posthoc.ln_free)
  if kind == 'layernorm':
    return LayerNorm(eps=cfg.norm_eps, axis=axis, use_scale=use_scale, name=name, divisor=divisor)
  if kind == 'rmsnorm':
    return RMSNorm(eps=cfg.norm_eps, axis=axis, use_scale=use_scale, use_bias=cfg.norm_bias,
                   name=name, divisor=divisor)
  if kind == 'crmsnorm':
    return CRMSNorm(eps=cfg.norm_eps, axis=axis, use_bias=cfg.norm_bias, name=name)
  if kind in ('scalenorm', 'seednorm', 'ss_rmsnorm'):
    return NORMS[kind].module(eps=cfg.norm_eps, axis=axis, name=name)
  if kind == 'bhyt':
    return BHyT(alpha0=_alpha0(cfg, position), kappa=cfg.bhyt_kappa, axis=axis, name=name)
  if kind in ('dyt', 'derf'):
    return NORMS[kind].module(alpha0=_alpha0(cfg, position), axis=axis, name=name)
  return Identity(axis=axis, name=name)


def rms_norm(cfg, name: str, axis: str) -> nn.Module:
  """An RMSNorm whatever model.norm is (QK-norm, SimpleNorm, HybridNorm's QKV norm)."""
  return RMSNorm(eps=cfg.norm_eps, axis=axis, name=name)
