"""Fast compute primitives: values and gradients equal the textbook functions (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.model import ops


def test_gelu_tanh_value_and_gradient_match_jax_gelu_in_float64():
  with jax.enable_x64(True):
    u = jnp.linspace(-6.0, 6.0, 241, dtype=jnp.float64)
    ref = lambda v: jax.nn.gelu(v, approximate=True)
    np.testing.assert_allclose(ops.gelu_tanh(u), ref(u), rtol=1e-14, atol=1e-14)
    g = jax.grad(lambda v: jnp.sum(jnp.sin(v) * ops.gelu_tanh(v)))(u)
    g_ref = jax.grad(lambda v: jnp.sum(jnp.sin(v) * ref(v)))(u)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-12)


def test_matmul_value_and_gradients_match_jnp_matmul_in_float64():
  with jax.enable_x64(True):
    kx, kw, kc = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (2, 5, 3), jnp.float64)
    w = jax.random.normal(kw, (3, 4), jnp.float64)
    c = jax.random.normal(kc, (2, 5, 4), jnp.float64)
    loss = lambda mm: lambda x, w: jnp.sum(c * mm(x, w) ** 2)
    np.testing.assert_allclose(ops.matmul(x, w), x @ w, rtol=1e-13)
    for got, want in zip(jax.grad(loss(ops.matmul), (0, 1))(x, w),
                         jax.grad(loss(jnp.matmul), (0, 1))(x, w)):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_jvp_through_custom_vjp_matmul_equals_forward_mode_in_float64():
  with jax.enable_x64(True):
    kx, kw, kv = jax.random.split(jax.random.PRNGKey(2), 3)
    w = jax.random.normal(kw, (3, 3), jnp.float64)
    carry = {'x': jax.random.normal(kx, (2, 4, 3), jnp.float64), 'y': jnp.ones((2, 4, 3))}
    v = jax.tree.map(lambda a: jax.random.normal(kv, a.shape, jnp.float64), carry)
    block = lambda mm: lambda c: {'x': jnp.tanh(mm(c['x'], w)) * c['y'], 'y': 2.0 * c['y']}
    out, jv = ops.jvp(block(ops.matmul), carry, v)
    want_out, want_jv = jax.jvp(block(jnp.matmul), (carry,), (v,))
    for got, want in zip(jax.tree.leaves((out, jv)), jax.tree.leaves((want_out, want_jv))):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # has_aux: the aux of the same forward comes back, out and J v unchanged
    with_aux = lambda c: (block(ops.matmul)(c), jnp.sum(c['x'] ** 2))
    aux_out, aux_jv, aux = ops.jvp(with_aux, carry, v, has_aux=True)
    for got, want in zip(jax.tree.leaves((aux_out, aux_jv)), jax.tree.leaves((want_out, want_jv))):
      np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(aux, jnp.sum(carry['x'] ** 2), rtol=1e-13)


@pytest.mark.parametrize('center', [True, False])
def test_standardize_value_gradient_and_jvp_match_the_textbook_norm_in_float64(center):
  """LayerNorm's (center) and RMSNorm's normalization; the custom VJP keeps only the output
  and the per-row scale."""
  def textbook(x):
    xc = x - x.mean(-1, keepdims=True) if center else x
    return xc / jnp.sqrt(jnp.mean(xc ** 2, -1, keepdims=True) + 1e-5)

  with jax.enable_x64(True):
    kx, kc, kv = jax.random.split(jax.random.PRNGKey(3), 3)
    x = 3.0 * jax.random.normal(kx, (2, 5, 8), jnp.float64) + 1.0
    c = jax.random.normal(kc, x.shape, jnp.float64)
    ours = lambda x: ops.standardize(x, 1e-5, center)
    np.testing.assert_allclose(ours(x), textbook(x), rtol=1e-13, atol=1e-13)
    loss = lambda f: lambda x: jnp.sum(c * jnp.tanh(f(x)))
    np.testing.assert_allclose(jax.grad(loss(ours))(x), jax.grad(loss(textbook))(x),
                               rtol=1e-11, atol=1e-12)
    v = jax.random.normal(kv, x.shape, jnp.float64)
    np.testing.assert_allclose(ops.jvp(ours, x, v)[1], jax.jvp(textbook, (x,), (v,))[1],
                               rtol=1e-11, atol=1e-12)


def test_attention_is_causal_softmax_attention():
  """Against a float64 masked softmax; jax's XLA path keeps its softmax in float32."""
  with jax.enable_x64(True):
    q, k, v = jax.random.normal(jax.random.PRNGKey(1), (3, 2, 6, 2, 4), jnp.float64)
    s = jnp.einsum('bthe,bshe->bhts', q, k) / 2.0 + jnp.where(jnp.tri(6, dtype=bool), 0.0, -jnp.inf)
    want = jnp.einsum('bhts,bshe->bthe', jax.nn.softmax(s, axis=-1), v)
    np.testing.assert_allclose(ops.attention(q, k, v), want, rtol=1e-5, atol=1e-6)


def _textbook_attention(q, k, v, scale):
  """Masked softmax attention, grouped KV heads repeated (H = G K)."""
  rep = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
  t = q.shape[1]
  s = jnp.einsum('bthe,bshe->bhts', q, k) * scale + jnp.where(jnp.tri(t, dtype=bool), 0.0, -jnp.inf)
  return jnp.einsum('bhts,bshe->bthe', jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize('t,block', [(12, 4), (128, 64)])
def test_blocked_causal_attention_values_and_gradients_in_float64(t, block):
  """Query blocks see only their causal prefix of keys; grouped KV heads (H 4, K 2)."""
  with jax.enable_x64(True):
    kq, kk, kv, kc = jax.random.split(jax.random.PRNGKey(4), 4)
    q = jax.random.normal(kq, (2, t, 4, 8), jnp.float64)
    k, v = (jax.random.normal(key, (2, t, 2, 8), jnp.float64) for key in (kk, kv))
    c = jax.random.normal(kc, q.shape, jnp.float64)
    blocked = lambda q, k, v: ops.blocked_causal_attention(q, k, v, 0.3, block)
    textbook = lambda q, k, v: _textbook_attention(q, k, v, 0.3)
    np.testing.assert_allclose(blocked(q, k, v), textbook(q, k, v), rtol=1e-12, atol=1e-12)
    loss = lambda fn: lambda q, k, v: jnp.sum(c * jnp.tanh(fn(q, k, v)))
    for got, want in zip(jax.grad(loss(blocked), (0, 1, 2))(q, k, v),
                         jax.grad(loss(textbook), (0, 1, 2))(q, k, v)):
      np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


def _loop_attention(q, k, v, scale, seg):
  """Float64 reference, one query at a time over its visible keys (causal, same segment)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  b, t, h, e = q.shape
  rep = h // k.shape[2]
  out = np.zeros_like(q)
  for i in range(b):
    for n in range(h):
      for j in range(t):
        keys = [s for s in range(j + 1) if seg[i, s] == seg[i, j]]
        logits = np.array([q[i, j, n] @ k[i, s, n // rep] for s in keys]) * scale
        p = np.exp(logits - logits.max())
        out[i, j, n] = (p / p.sum()) @ v[i, keys, n // rep]
  return out


@pytest.mark.parametrize('t', [12, 2 * ops.CPU_ATTENTION_BLOCK])
def test_attention_with_segment_ids_sees_only_its_own_document(t):
  """Document masking: both kernels (XLA's masked composition at T 12, the CPU blocked path
  at T 128) against a per-query float64 loop; segments of random lengths, grouped KV."""
  with jax.enable_x64(True):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(6), 3)
    q = jax.random.normal(kq, (2, t, 4, 8), jnp.float64)
    k, v = (jax.random.normal(key, (2, t, 2, 8), jnp.float64) for key in (kk, kv))
    rng = np.random.default_rng(0)
    seg = np.cumsum(rng.random((2, t)) < 0.15, axis=1).astype(np.int32)
    assert seg.max() >= 2
    got = ops.attention(q, k, v, 0.3, 'blocked', segment_ids=jnp.asarray(seg))
    np.testing.assert_allclose(got, _loop_attention(q, k, v, 0.3, seg), rtol=1e-5, atol=1e-6)
    one = ops.attention(q, k, v, 0.3, 'blocked', segment_ids=jnp.zeros((2, t), jnp.int32))
    np.testing.assert_allclose(one, _textbook_attention(q, k, v, 0.3), rtol=1e-5, atol=1e-6)


def test_attention_on_cpu_takes_the_blocked_path_at_multiples_of_the_block():
  t = 2 * ops.CPU_ATTENTION_BLOCK
  q, k, v = jax.random.normal(jax.random.PRNGKey(5), (3, 1, t, 2, 4))
  want = _textbook_attention(q, k, v, 0.5)
  blocked = lambda q, k, v: ops.attention(q, k, v, 0.5, ops.default_attention_kernel('cpu'))
  np.testing.assert_allclose(blocked(q, k, v), want, rtol=1e-5, atol=1e-6)
  jaxpr = str(jax.make_jaxpr(blocked)(q, k, v))
  assert jaxpr.count('dot_general') == 4  # 2 query blocks x (scores, values)


@pytest.mark.filterwarnings('ignore:Error writing persistent compilation cache')  # oneDNN's
def test_compiler_options_change_speed_not_results():
  """The CPU dot-library options compile the same math: a model-shaped matmul chain and its
  gradients agree with XLA's defaults to float32 rounding."""
  kx, kw = jax.random.split(jax.random.PRNGKey(3))
  x, w = jax.random.normal(kx, (4, 16, 32)), jax.random.normal(kw, (32, 32)) / 6.0
  fn = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(ops.gelu_tanh(ops.matmul(x, w)) @ w.T), (0, 1)))
  lowered = fn.lower(x, w)
  default = lowered.compile()(x, w)
  for options in (ops.CPU_COMPILER_OPTIONS, ops.CACHEABLE_CPU_COMPILER_OPTIONS):
    for got, want in zip(jax.tree.leaves(lowered.compile(options)(x, w)), jax.tree.leaves(default)):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_fake_cpu_mesh_compiles_without_onednn():
  """oneDNN only for one CPU device: with several, its thread-pool adaptor crashed."""
  assert ops.compiler_options('cpu', devices=8) in (None, ops.CACHEABLE_CPU_COMPILER_OPTIONS)
  assert ops.compiler_options('tpu', devices=8) is None


def test_cudnn_kernel_takes_xla_attention_where_cudnn_does_not_apply():
  """cuDNN's fused attention takes bf16/f16 inputs, head dims that are multiples of 8 up to 128
  and the causal mask alone; otherwise the 'cudnn' kernel computes XLA's attention (on this
  CPU host cuDNN's kernel would not trace at all), equal to a float64 reference."""
  assert ops.cudnn_unsupported(jnp.bfloat16, 128, False) is None
  assert ops.cudnn_unsupported(jnp.float16, 64, False) is None
  assert 'dtype float32' in ops.cudnn_unsupported(jnp.float32, 64, False)
  assert 'head dim 136' in ops.cudnn_unsupported(jnp.bfloat16, 136, False)
  assert 'head dim 12' in ops.cudnn_unsupported(jnp.bfloat16, 12, False)
  assert 'document mask' in ops.cudnn_unsupported(jnp.bfloat16, 64, True)
  q, k, v = jax.random.normal(jax.random.PRNGKey(6), (3, 2, 8, 2, 16))
  got = ops.attention(q, k, v, 0.4, 'cudnn')  # float32: XLA's composition
  with jax.enable_x64(True):
    want = _textbook_attention(*(jnp.asarray(a, jnp.float64) for a in (q, k, v)), 0.4)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
