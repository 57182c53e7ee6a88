"""LayerRoPE (2026) -- a WORKING INTERPRETATION of the paper's abstract (no code
or full text found): every block norm's gain is gamma_l = s_l * R(l * theta) gamma_shared,
one learnable gamma_shared in R^D for the whole stack, R(phi) rotating coordinate pairs
(2k, 2k+1) by phi * base^(-2k/D), and one learnable scalar s_l per norm (init 1). The
final norm keeps its own gain. theta = model.layer_rope_theta, base = model.layer_rope_base.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.model.norms import make_norm


def rotate(gain_D: jax.Array, angle: jax.Array, base: float) -> jax.Array:
  """R(angle) gain: pair (2k, 2k+1) rotated by angle * base^(-2k/D)."""
  d = gain_D.shape[-1]
  phi = angle * base ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  g0, g1 = gain_D[0::2], gain_D[1::2]
  cos, sin = jnp.cos(phi), jnp.sin(phi)
  return jnp.stack([g0 * cos - g1 * sin, g0 * sin + g1 * cos], axis=-1).reshape(d)


def shared_gain(module: nn.Module, d_model: int) -> jax.Array:
  """gamma_shared (init 1), a parameter of the Transformer outside the scan."""
  init = nn.with_logical_partitioning(nn.initializers.ones, ('embed',))
  return module.param('layer_rope_gain', init, (d_model,), jnp.float32)


class LayerRopeNorm(nn.Module):
  """The configured norm without its own gain, times s_l * R(l * theta) gamma_shared."""
  cfg: Any
  position: str

  @nn.compact
  def __call__(self, x, index: jax.Array, gain_D: jax.Array):
    cfg = self.cfg
    y = make_norm(cfg, 'norm', position=self.position, use_scale=False)(x)
    s = self.param('depth_scale', nn.initializers.ones, (), jnp.float32)
    gain = s * rotate(gain_D, index.astype(jnp.float32) * cfg.layer_rope_theta, cfg.layer_rope_base)
    return (y * gain).astype(x.dtype)
