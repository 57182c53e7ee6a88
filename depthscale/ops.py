"""Fast compute primitives of the model: GELU with a one-residual backward pass and the
backend-chosen attention kernel. Numerically the textbook functions; only the work
(and memory) XLA is given differs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

_C = math.sqrt(2.0 / math.pi)
_A = 0.044715


@jax.custom_vjp
def gelu_tanh(u):
  """GELU, tanh form: 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))), as jax.nn.gelu.

  Autodiff of the formula keeps ~5 activation-sized residuals per call (u, u^2, u^3,
  tanh, ...) and XLA-CPU fuses their reads into one strided, transposing loop; this
  version keeps only u and recomputes tanh in the backward pass.
  """
  return 0.5 * u * (1.0 + jnp.tanh(_C * (u + _A * u * u * u)))


def _gelu_fwd(u):
  return gelu_tanh(u), u


def _gelu_bwd(u, g):
  uu = u * u
  t = jnp.tanh(_C * u * (1.0 + _A * uu))
  du = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * uu)
  return (g * du,)


gelu_tanh.defvjp(_gelu_fwd, _gelu_bwd)


@jax.custom_vjp
def matmul(x_NxI, w_IxO):
  """x @ w over the last axis of x, with the weight gradient computed as x^T g.

  JAX's own transpose rule computes the weight gradient as (g^T x)^T; XLA-CPU then
  transposes g (the larger, often fused, operand) instead of x.
  """
  return jnp.matmul(x_NxI, w_IxO)


def _matmul_fwd(x_NxI, w_IxO):
  return matmul(x_NxI, w_IxO), (x_NxI, w_IxO)


def _matmul_bwd(res, g_NxO):
  x_NxI, w_IxO = res
  x2 = x_NxI.reshape(-1, x_NxI.shape[-1])
  g2 = g_NxO.reshape(-1, g_NxO.shape[-1])
  dw_IxO = jax.lax.dot_general(x2, g2, (((0,), (0,)), ((), ())))
  dx = jax.lax.dot_general(g_NxO, w_IxO, (((g_NxO.ndim - 1,), (1,)), ((), ())))
  return dx, dw_IxO.astype(w_IxO.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale: float | None = None):
  """Causal softmax attention, kernel chosen by backend: cuDNN's fused kernel on GPU (bf16
  or f16 inputs), XLA's composition elsewhere (CPU, TPU, f32)."""
  impl = None
  if jax.default_backend() == 'gpu' and q_BxTxHxE.dtype in (jnp.bfloat16, jnp.float16):
    impl = 'cudnn'
  return jax.nn.dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale=scale,
                                      is_causal=True, implementation=impl)
