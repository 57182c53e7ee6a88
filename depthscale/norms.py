"""Norm functions, selected by `model.norm`; each is a module over the last axis."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp


def _param(module: nn.Module, name: str, init, size: int, axis: str):
  return module.param(name, nn.with_logical_partitioning(init, (axis,)), (size,), jnp.float32)


class LayerNorm(nn.Module):
  """LN(x) = g * (x - mean) / sqrt(var + eps) + b; g starts at 1, b at 0."""
  eps: float = 1e-5
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jnp.reciprocal(jnp.sqrt(var + self.eps))
    y = y * _param(self, 'scale', nn.initializers.ones, d, self.axis)
    y = y + _param(self, 'bias', nn.initializers.zeros, d, self.axis)
    return y.astype(x.dtype)


class RMSNorm(nn.Module):
  """RMSNorm(x) = g * x / sqrt(mean(x^2) + eps); no bias, g starts at 1."""
  eps: float = 1e-5
  axis: str = 'embed'

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x32 = x.astype(jnp.float32)
    y = x32 * jnp.reciprocal(jnp.sqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps))
    return (y * _param(self, 'scale', nn.initializers.ones, d, self.axis)).astype(x.dtype)


NORMS = {'layernorm': LayerNorm, 'rmsnorm': RMSNorm}


def make_norm(cfg, name: str, axis: str = 'embed') -> nn.Module:
  """Builds the configured norm (cfg is the model config) as a submodule called `name`."""
  return NORMS[cfg.norm](eps=cfg.norm_eps, axis=axis, name=name)
