"""MoDA (mixture-of-depths attention): the joint sequence + depth softmax against a float64
reference; each layer appends its own post-RoPE keys and values to the depth stream; layer 1
(no depth entries) is plain causal attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale import config
from depthscale.model import moda, ops
from depthscale.model.transformer import Block, Transformer, make_model, rope
from tests.helpers import init, small_config


def _reference(q, k, v, depth_k, depth_v, num_valid, scale):
  """Per (b, t, h): softmax over the causal keys j <= t and the depth keys i < num_valid."""
  b_, t_, h_, _ = q.shape
  group = h_ // k.shape[2]
  out = np.zeros(q.shape)
  for b in range(b_):
    for t in range(t_):
      for h in range(h_):
        g = h // group
        keys = [k[b, j, g] for j in range(t + 1)] + [depth_k[i, b, t, g] for i in range(num_valid)]
        vals = [v[b, j, g] for j in range(t + 1)] + [depth_v[i, b, t, g] for i in range(num_valid)]
        logits = scale * np.array([q[b, t, h] @ key for key in keys])
        w = np.exp(logits - logits.max())
        out[b, t, h] = (w / w.sum()) @ np.array(vals)
  return out


@pytest.mark.parametrize('num_valid', [0, 2, 4])
def test_joint_softmax_matches_float64_reference(num_valid):
  rng = np.random.default_rng(num_valid)
  b, t, h, kv, e, depth = 2, 5, 4, 2, 3, 4  # grouped KV heads: 2 query heads per KV head
  q, k, v = (rng.normal(size=s) for s in ((b, t, h, e), (b, t, kv, e), (b, t, kv, e)))
  depth_k, depth_v = rng.normal(size=(2, depth, b, t, kv, e))
  got = moda.attention(*(jnp.asarray(a, jnp.float32) for a in (q, k, v, depth_k, depth_v)),
                       num_valid, 0.7)
  np.testing.assert_allclose(got, _reference(q, k, v, depth_k, depth_v, num_valid, 0.7),
                             rtol=1e-5, atol=1e-6)


def test_without_depth_entries_it_is_causal_attention():
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 8, 2, 4)), jnp.float32) for _ in range(3))
  empty = jnp.asarray(rng.normal(size=(3, 2, 8, 2, 4)), jnp.float32)  # masked: never read
  np.testing.assert_allclose(moda.attention(q, k, v, empty, empty, 0, 0.5),
                             ops.attention(q, k, v, 0.5), rtol=1e-5, atol=1e-6)


def test_each_layer_appends_its_own_keys_and_values():
  """After block l the depth slot l-1 holds RoPE(LN(x) W_K) and LN(x) W_V of that block's
  input x, and the later slots are still empty."""
  model, params = init(**{'model.moda': True, 'model.num_layers': 3})
  cfg = model.cfg
  x = model.apply({'params': params}, jnp.arange(16)[None] % cfg.vocab_size, method=Transformer.embed)
  carry = model.apply({'params': params}, x, method=Transformer.start)
  schedule = {k: v[0] for k, v in config.placements.layer_schedule(cfg).items()}
  p0 = jax.tree.map(lambda a: a[0], params['blocks'])
  out, _ = Block(cfg).apply({'params': p0}, carry, schedule)
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  h = (x - mean) / jnp.sqrt(var + cfg.norm_eps) * p0['attn_norm']['scale'] + p0['attn_norm']['bias']
  kv = jnp.einsum('btd,dske->btske', h, p0['attn']['kv'])
  np.testing.assert_allclose(out['moda_k'][0], rope(kv[:, :, 0], cfg.rope_base), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['moda_v'][0], kv[:, :, 1], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out['moda_k'][1:], 0.0)


def test_one_layer_moda_is_the_standard_model():
  base, params = init(**{'model.num_layers': 1})
  with_depth = make_model(small_config(**{'model.num_layers': 1, 'model.moda': True}))
  tokens = jnp.arange(16)[None] % base.cfg.vocab_size
  np.testing.assert_allclose(with_depth.apply({'params': params}, tokens)[0],
                             base.apply({'params': params}, tokens)[0], rtol=1e-5, atol=1e-5)
