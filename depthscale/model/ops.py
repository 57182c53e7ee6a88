"""Fast compute primitives of the model: GELU with a one-residual backward pass, the norms'
standardization with a two-residual one, matmuls with a cache-friendly weight gradient and
the backend-chosen attention kernel. Numerically the textbook functions; only the work (and
memory) XLA is given differs."""

from __future__ import annotations

import functools
import math
import platform

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


@jax.custom_vjp
def matmul(x_NxI, w_IxO):
  """x @ w over the last axis of x, with the weight gradient computed as x^T g.

  JAX's transpose rule computes the weight gradient as (g^T x)^T, and XLA-CPU then writes
  g (the larger operand, fused with the activation's backward pass) transposed, a slow
  strided loop; here x is transposed instead. Reverse mode only (a custom VJP): use
  `jvp` below for forward-mode products through the model.
  """
  return jnp.matmul(x_NxI, w_IxO)


def _matmul_fwd(x_NxI, w_IxO):
  return matmul(x_NxI, w_IxO), (x_NxI, w_IxO)


def _matmul_bwd(res, g_NxO):
  x_NxI, w_IxO = res
  x2, g2 = x_NxI.reshape(-1, x_NxI.shape[-1]), g_NxO.reshape(-1, g_NxO.shape[-1])
  dw_IxO = jax.lax.dot_general(x2, g2, (((0,), (0,)), ((), ())))
  dx = jax.lax.dot_general(g_NxO, w_IxO, (((g_NxO.ndim - 1,), (1,)), ((), ())))
  return dx, dw_IxO.astype(w_IxO.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def standardize(x, eps: float, center: bool):
  """(x - mean) / sqrt(var + eps) over the last axis; center=False: x / sqrt(mean(x^2) + eps).

  LayerNorm's and RMSNorm's normalization. Autodiff of the formula keeps ~4 activation-
  sized residuals per call; this VJP keeps the output y and the per-row scale r:
  dx = r (g - mean(g) - y mean(g y)) (without mean(g) when not centred).
  """
  return _standardize(x, eps, center)[0]


def _standardize(x, eps, center):
  xc = x - x.mean(-1, keepdims=True) if center else x
  r = jnp.reciprocal(jnp.sqrt(jnp.square(xc).mean(-1, keepdims=True) + eps))
  return xc * r, r


def _standardize_fwd(x, eps, center):
  y, r = _standardize(x, eps, center)
  return y, (y, r)


def _standardize_bwd(eps, center, res, g):
  del eps
  y, r = res
  g_perp = g - y * jnp.mean(g * y, -1, keepdims=True)
  if center:
    g_perp = g_perp - jnp.mean(g, -1, keepdims=True)
  return (r * g_perp,)


standardize.defvjp(_standardize_fwd, _standardize_bwd)


def jvp(fn, primal, tangent):
  """(fn(primal), J tangent) as the transpose of fn's VJP (custom VJPs have no forward mode)."""
  out, vjp_fn = jax.vjp(fn, primal)
  (jv,) = jax.linear_transpose(vjp_fn, out)((tangent,))
  return out, jv


# XLA-CPU dot libraries for the train step on x86 (benchmarks/NOTES.md, config S): oneDNN
# for dots and nothing for YNNPACK, ~1.35x over XLA's defaults. oneDNN executables cannot be
# written to JAX's persistent compilation cache, so with a cache configured the step uses
# XLA's own (Eigen) dots instead: cacheable, ~5% slower.
CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': '', 'xla_cpu_use_onednn': True,
                        'xla_cpu_experimental_onednn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'}
CACHEABLE_CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': ''}


def compiler_options() -> dict | None:
  """Per-compile XLA options for this backend and machine (None: XLA's defaults)."""
  if jax.default_backend() != 'cpu' or platform.machine().lower() not in ('x86_64', 'amd64'):
    return None
  if jax.config.jax_compilation_cache_dir:
    return CACHEABLE_CPU_COMPILER_OPTIONS
  return CPU_COMPILER_OPTIONS


# Query block of the CPU attention: causal blocks above the diagonal are never computed.
CPU_ATTENTION_BLOCK = 64


def document_mask(segment_ids_BxT, lo: int = 0, hi: int | None = None):
  """Bx1x1xQxS (queries lo:hi, keys :hi): True where query and key share a segment id."""
  q_BxQ = segment_ids_BxT[:, lo:hi]
  k_BxS = segment_ids_BxT[:, :hi]
  return (q_BxQ[:, :, None] == k_BxS[:, None, :])[:, None, None]


def blocked_causal_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale: float, block: int,
                             segment_ids_BxT=None):
  """Causal softmax attention by query blocks: block i attends to keys [0, (i+1) block), so
  the n (n - 1) / 2 block pairs above the diagonal (n = T / block; 6 of 16 at n = 4) are
  skipped rather than masked. Grouped KV heads: H = G K. With segment ids, a query sees
  only keys of its own segment (document masking)."""
  b, t, h, e = q_BxTxHxE.shape
  kv = k_BxTxKxE.shape[2]
  q_BxTxKxGxE = q_BxTxHxE.reshape(b, t, kv, h // kv, e)
  outs = []
  for lo in range(0, t, block):
    hi = lo + block
    s_BxKxGxQxS = jnp.einsum('bqkge,bske->bkgqs', q_BxTxKxGxE[:, lo:hi], k_BxTxKxE[:, :hi]) * scale
    keep = jnp.arange(hi)[None, :] <= (lo + jnp.arange(block))[:, None]
    if segment_ids_BxT is not None:
      keep = keep & document_mask(segment_ids_BxT, lo, hi)
    s_BxKxGxQxS = jnp.where(keep, s_BxKxGxQxS, jnp.finfo(s_BxKxGxQxS.dtype).min)
    p_BxKxGxQxS = jax.nn.softmax(s_BxKxGxQxS, axis=-1)
    outs.append(jnp.einsum('bkgqs,bske->bqkge', p_BxKxGxQxS, v_BxTxKxE[:, :hi]))
  return jnp.concatenate(outs, axis=1).reshape(b, t, h, e)


def attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale: float | None = None, segment_ids=None):
  """Causal softmax attention, kernel chosen by backend: cuDNN's fused kernel on GPU (bf16
  or f16 inputs), query-blocked on CPU (1.5x XLA's full masked composition, forward and
  backward, at T = 256), XLA's composition elsewhere. segment_ids (BxT ints, or None):
  document masking, no query attends to a key of another segment (XLA's composition with
  the mask off the CPU path)."""
  t = q_BxTxHxE.shape[1]
  backend = jax.default_backend()
  if backend == 'cpu' and t > CPU_ATTENTION_BLOCK and t % CPU_ATTENTION_BLOCK == 0:
    scale = q_BxTxHxE.shape[-1] ** -0.5 if scale is None else scale
    return blocked_causal_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, CPU_ATTENTION_BLOCK,
                                    segment_ids)
  impl = None
  if backend == 'gpu' and q_BxTxHxE.dtype in (jnp.bfloat16, jnp.float16) and segment_ids is None:
    impl = 'cudnn'
  mask = None if segment_ids is None else document_mask(segment_ids)[:, 0]
  return jax.nn.dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale=scale, mask=mask,
                                      is_causal=True, implementation=impl)
