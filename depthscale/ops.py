"""Fast compute primitives of the model: GELU with a one-residual backward pass and the
backend-chosen attention kernel. Numerically the textbook functions; only the work
(and memory) XLA is given differs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_C = math.sqrt(2.0 / math.pi)
_A = 0.044715


@jax.custom_jvp
def gelu_tanh(u):
  """GELU, tanh form: 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))), as jax.nn.gelu.

  Autodiff of the formula keeps ~5 activation-sized residuals per call (u, u^2, u^3,
  tanh, ...) and XLA-CPU fuses their reads into one strided, transposing loop; with this
  JVP rule the backward pass keeps one (the derivative). A custom JVP (not VJP) so that
  forward-mode analyses still work.
  """
  return 0.5 * u * (1.0 + jnp.tanh(_C * (u + _A * u * u * u)))


@gelu_tanh.defjvp
def _gelu_jvp(primals, tangents):
  (u,), (du,) = primals, tangents
  uu = u * u
  t = jnp.tanh(_C * u * (1.0 + _A * uu))
  slope = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * uu)
  return 0.5 * u * (1.0 + t), slope * du


def matmul(x_NxI, w_IxO):
  """x @ w over the last axis of x (one place to choose how projections are computed).

  A custom-VJP version computing the weight gradient as x^T g measured 1.16x faster on
  CPU but breaks forward-mode autodiff (depthscale.analysis); see benchmarks/NOTES.md.
  """
  return jnp.matmul(x_NxI, w_IxO)


def attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale: float | None = None):
  """Causal softmax attention, kernel chosen by backend: cuDNN's fused kernel on GPU (bf16
  or f16 inputs), XLA's composition elsewhere (CPU, TPU, f32)."""
  impl = None
  if jax.default_backend() == 'gpu' and q_BxTxHxE.dtype in (jnp.bfloat16, jnp.float16):
    impl = 'cudnn'
  return jax.nn.dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale=scale,
                                      is_causal=True, implementation=impl)
