"""Fast compute primitives of the model: GELU with a one-residual backward pass, the norms'
standardization with a two-residual one, matmuls with a cache-friendly weight gradient and
the attention kernels. Numerically the textbook functions; only the work (and memory) XLA is
given differs. Every backend-dependent choice takes the platform of the devices the program
is compiled for (`platform_of`), never the host's default backend."""

from __future__ import annotations

import functools
import math
import platform

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

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


def relu_squared(u):
  """Squared ReLU, max(u, 0)^2 (So et al. 2021, Primer, arXiv 2109.08668)."""
  r = jax.nn.relu(u)
  return r * r


# model.mlp -> the activation of a two-matrix MLP; 'swiglu' (three matrices) is gated.
ACTIVATIONS = {'gelu': gelu_tanh, 'relu': jax.nn.relu, 'relu2': relu_squared}
MLPS = (*ACTIVATIONS, 'swiglu')


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


def jvp(fn, primal, tangent, has_aux: bool = False):
  """(fn(primal), J tangent) as the transpose of fn's VJP (custom VJPs have no forward mode);
  has_aux: fn returns (out, aux) and this (out, J tangent, aux), aux from the same forward."""
  out, vjp_fn, *aux = jax.vjp(fn, primal, has_aux=has_aux)
  (jv,) = jax.linear_transpose(vjp_fn, out)((tangent,))
  return (out, jv, *aux)


# XLA-CPU dot libraries for the train step on x86 (benchmarks/NOTES.md, config S): oneDNN
# for dots and nothing for YNNPACK, ~1.35x over XLA's defaults. oneDNN executables cannot be
# written to JAX's persistent compilation cache, so with a cache configured the step uses
# XLA's own (Eigen) dots instead: cacheable, ~5% slower. A program over several CPU devices
# (a fake mesh) keeps XLA's dots too: with oneDNN and 32 XLA threads for 8 devices, sharded
# train steps crashed in oneDNN's thread-pool adaptor and the analyses hung in a collective.
# Which of the two is faster depends on the host and the shape: where both are allowed
# (onednn_allowed), train.cpu_options picks one of CPU_OPTION_SETS, by default by timing the
# rung's own step (depthscale.training.cpu_calibration, benchmarks/NOTES.md).
CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': '', 'xla_cpu_use_onednn': True,
                        'xla_cpu_experimental_onednn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'}
CACHEABLE_CPU_COMPILER_OPTIONS = {'xla_cpu_experimental_ynn_fusion_type': ''}
CPU_OPTION_SETS = {'onednn': CPU_COMPILER_OPTIONS, 'eigen': CACHEABLE_CPU_COMPILER_OPTIONS}


def platform_of(devices=None) -> str:
  """'cpu', 'gpu' or 'tpu': the platform of the devices a program is compiled for
  (default: jax.devices(), the devices a mesh is built from when none are given)."""
  return (jax.devices() if devices is None else list(devices))[0].platform


# LLVM optimization levels of a CPU program that runs a few times (the analyses; None: XLA's
# default): the same computation. Against the default, level 1 took ~1.3-1.7x less compile CPU
# time and ran as fast, level 0 ~2x less and ran ~1.4-4.3x slower (benchmarks/NOTES.md,
# periodic analyses).
CPU_OPT_LEVELS = {'optimized': None, 'light': 1, 'fast': 0}
# ...and at a reduced level XLA's classic loop emitters instead of its fusion emitters (as the
# tests' FAST_COMPILE): the same IEEE operations; the analysis compiled ~2x faster at level 0
# and 5-20% faster at level 1 with them, and ran as fast; at the default level they compiled
# slower (benchmarks/NOTES.md, the analysis program's compile, round 3).
REDUCED_LEVEL_OPTIONS = {'xla_cpu_use_fusion_emitters': False}


def _x86() -> bool:
  return platform.machine().lower() in ('x86_64', 'amd64')


def onednn_allowed(target: str, devices: int = 1) -> bool:
  """Whether a program for platform `target` over `devices` devices may take the oneDNN
  options: a CPU target on an x86 host (the host is the target), one device and no JAX
  compilation cache. Only there do the sets of CPU_OPTION_SETS differ."""
  return target == 'cpu' and _x86() and devices == 1 and not jax.config.jax_compilation_cache_dir


def compiler_options(target: str, devices: int = 1, opt_level: int | None = None,
                     cpu_set: str = 'onednn') -> dict | None:
  """Per-compile XLA options for a program compiled for platform `target` over `devices`
  devices (None: XLA's defaults); the CPU options only for a CPU target on an x86 host:
  CPU_OPTION_SETS[cpu_set] where onednn_allowed, else the cacheable ones. opt_level: a CPU
  program's LLVM optimization level (CPU_OPT_LEVELS; None: XLA's default), with
  REDUCED_LEVEL_OPTIONS where set."""
  if target != 'cpu':
    return None
  extra = {} if opt_level is None else {'xla_backend_optimization_level': opt_level,
                                        **REDUCED_LEVEL_OPTIONS}
  if not _x86():
    return extra or None
  allowed = onednn_allowed(target, devices)
  return {**(CPU_OPTION_SETS[cpu_set] if allowed else CACHEABLE_CPU_COMPILER_OPTIONS), **extra}


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


# Pallas splash attention (TPU): query / key block of the kernel, the largest of these
# dividing T; other lengths take XLA's composition.
SPLASH_BLOCKS = (512, 256, 128)
ATTENTION_KERNELS = ('xla', 'blocked', 'cudnn', 'splash', 'splash_interpret')


def default_attention_kernel(target: str) -> str:
  """The kernel for platform `target`: splash on TPU, cuDNN on GPU, query-blocked on CPU."""
  return {'tpu': 'splash', 'gpu': 'cudnn', 'cpu': 'blocked'}.get(target, 'xla')


def _mesh_axes(logical: str, sizes: tuple[int, ...], mesh) -> tuple[str, ...]:
  """The mesh axes the logical-axis rules in scope map `logical` to, kept while their
  product divides every one of `sizes` (as depthscale.training.sharding.spec_for)."""
  rule = dict(nn.get_logical_axis_rules()).get(logical) or ()
  axes, n = [], 1
  for a in (rule,) if isinstance(rule, str) else rule:
    if a in mesh.shape and all(s % (n * mesh.shape[a]) == 0 for s in sizes):
      axes.append(a)
      n *= mesh.shape[a]
  return tuple(axes)


def splash_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, interpret: bool = False):
  """Causal attention by the Pallas TPU splash kernel (flash attention over a causal block
  mask; no T x T scores in memory). Grouped KV heads (H = G K) go to the kernel as they are;
  the softmax scale (a float or a traced scalar, e.g. a learnable QK-norm gain) multiplies q
  before the kernel, so every QK-norm variant is exact. Mosaic kernels cannot be
  partitioned by XLA, so the kernel runs inside shard_map over the mesh in scope: batch
  rows over the mesh axes of the logical 'batch' rule, heads over those of 'heads' (where
  they divide B, H and K). interpret=True: the Pallas interpreter (any backend; tests).
  T must be a multiple of 128 (`attention` falls back to XLA otherwise)."""
  b, t, h, e = q_BxTxHxE.shape
  kv = k_BxTxKxE.shape[2]
  block = next(s for s in SPLASH_BLOCKS if t % s == 0)
  q_BxTxHxE = q_BxTxHxE * jnp.asarray(scale, q_BxTxHxE.dtype)

  def local(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE):
    heads = q_BxTxHxE.shape[2]
    mask = splash.MultiHeadMask([splash.CausalMask((t, t))] * heads)
    sizes = splash.BlockSizes(block, block, block, block, block, block, block, block)
    kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
    to_heads = lambda x: jnp.swapaxes(x, 1, 2)  # B x N x T x E, the kernel's layout
    o_BxHxTxE = jax.vmap(kernel)(to_heads(q_BxTxHxE), to_heads(k_BxTxKxE), to_heads(v_BxTxKxE))
    return jnp.swapaxes(o_BxHxTxE, 1, 2)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)
  batch, heads = _mesh_axes('batch', (b,), mesh), _mesh_axes('heads', (h, kv), mesh)
  spec = PartitionSpec(batch or None, None, heads or None, None)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                       check_vma=False)(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE)


# cuDNN's fused (flash) attention in JAX: bf16 or f16 inputs, a head dim that is a multiple of
# 8 and at most 128 (jax.nn.dot_product_attention allows 256 from Hopper on, but reads the
# architecture from the host's default devices: 128 keeps the dry run's program the
# cluster's), and no mask beyond the causal one.
CUDNN_MAX_HEAD_DIM = 128


def cudnn_unsupported(dtype, head_dim: int, document_mask: bool) -> str | None:
  """Why cuDNN's fused attention does not take these inputs (XLA's composition then runs),
  None where it does."""
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return f'dtype {jnp.dtype(dtype).name} (cuDNN fuses bfloat16 and float16)'
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    return f'head dim {head_dim} (cuDNN: a multiple of 8, at most {CUDNN_MAX_HEAD_DIM})'
  if document_mask:
    return 'document mask (cuDNN here: the causal mask only)'
  return None


def attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale=None, kernel: str = 'xla',
              segment_ids=None):
  """Causal softmax attention by `kernel` (see default_attention_kernel): 'splash' the
  Pallas TPU kernel ('splash_interpret': the same kernel interpreted, on any backend);
  'cudnn' cuDNN's fused kernel (where cudnn_unsupported allows); 'blocked' the CPU
  query-blocked composition (1.5x XLA's full masked composition, forward and backward, at
  T = 256); 'xla' XLA's full masked composition. Fallbacks to XLA's composition: splash
  when T is not a multiple of 128, cuDNN where cudnn_unsupported names a reason, blocked
  when T is not a multiple of its block. No attention variant of the model needs explicit
  scores in the train step (the QK-norm variants act on q and k, learnable scales on q);
  the analyses' attention entropy computes its own probabilities. segment_ids (BxT ints,
  or None): document masking, no query attends to a key of another segment (the blocked
  kernel or XLA's composition with the mask; splash and cuDNN then fall back to XLA's
  composition)."""
  if kernel not in ATTENTION_KERNELS:
    raise ValueError(f'attention kernel {kernel!r}: allowed one of {", ".join(ATTENTION_KERNELS)}')
  t = q_BxTxHxE.shape[1]
  scale = q_BxTxHxE.shape[-1] ** -0.5 if scale is None else scale
  if kernel.startswith('splash') and t % SPLASH_BLOCKS[-1] == 0 and segment_ids is None:
    return splash_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, kernel == 'splash_interpret')
  if kernel == 'blocked' and t > CPU_ATTENTION_BLOCK and t % CPU_ATTENTION_BLOCK == 0:
    return blocked_causal_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale, CPU_ATTENTION_BLOCK,
                                    segment_ids)
  fused = kernel == 'cudnn' and cudnn_unsupported(q_BxTxHxE.dtype, q_BxTxHxE.shape[-1],
                                                  segment_ids is not None) is None
  mask = None if segment_ids is None else document_mask(segment_ids)[:, 0]
  return jax.nn.dot_product_attention(q_BxTxHxE, k_BxTxKxE, v_BxTxKxE, scale=scale, mask=mask,
                                      is_causal=True, implementation='cudnn' if fused else None)
