"""The target decides the kernels: attention kernel, XLA options, layer-scan unrolling and
host-memory settings follow the platform of the devices a program is compiled for; the
Pallas TPU splash attention (interpreted on CPU) equals XLA's attention."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.config import validate
from depthscale.errors import ConfigError
from depthscale.model import ops
from depthscale.model.transformer import make_model
from depthscale.training import host_memory, sharding
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state, model_loss
from tests.helpers import fake_cpu_env, tiny_config



@pytest.mark.parametrize('platform,kernel,unroll', [('cpu', 'blocked', 16), ('tpu', 'splash', 0),
                                                    ('gpu', 'cudnn', 0)])
def test_platform_resolves_kernel_and_unroll_defaults(platform, kernel, unroll):
  model = make_model(tiny_config(), platform=platform)
  assert (model.cfg.platform, model.cfg.attention_kernel, model.cfg.unroll_max_layers) == (
      platform, kernel, unroll)
  explicit = make_model(tiny_config(**{'model.unroll_max_layers': 8,
                                       'model.attention_kernel': 'xla'}), platform=platform)
  assert (explicit.cfg.attention_kernel, explicit.cfg.unroll_max_layers) == ('xla', 8)
  assert (ops.compiler_options(platform) is None) == (platform != 'cpu' or
                                                       ops.compiler_options('cpu') is None)
  assert not host_memory.keep_freed_memory(platform) or platform == 'cpu'


def test_invalid_kernel_or_unroll_and_a_plan_for_other_devices_are_refused():
  for field, value in (('model.unroll_max_layers', -2), ('model.attention_kernel', 'flash')):
    with pytest.raises(ConfigError, match=field):
      validate(tiny_config(**{field: value}))
  cfg = tiny_config()
  with pytest.raises(ValueError, match="platform='cpu'"):
    sharding.make_plan(cfg, make_model(cfg, platform='tpu'), make_optimizer(cfg), init_state)


def _qkv(t, h=4, k=2, e=8, b=2, seed=0):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(kq, (b, t, h, e)), jax.random.normal(kk, (b, t, k, e)),
          jax.random.normal(kv, (b, t, k, e)))


def test_splash_attention_equals_xla_attention_values_and_gradients():
  """Interpret mode, T 384 (three 128-blocks: the causal block skipping is exercised),
  grouped KV heads H 4 = 2 x K 2, the model's scale."""
  q, k, v = _qkv(384)
  c = jax.random.normal(jax.random.PRNGKey(9), q.shape)
  loss = lambda kernel: lambda q, k, v: jnp.sum(c * ops.attention(q, k, v, 0.3, kernel))
  for kernel in ('splash_interpret', 'xla'):
    assert ops.attention(q, k, v, 0.3, kernel).shape == q.shape
  np.testing.assert_allclose(ops.attention(q, k, v, 0.3, 'splash_interpret'),
                             ops.attention(q, k, v, 0.3, 'xla'), rtol=1e-5, atol=1e-5)
  got = jax.jit(jax.grad(loss('splash_interpret'), (0, 1, 2)))(q, k, v)
  for g, w in zip(got, jax.grad(loss('xla'), (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('qk_norm', ['none', 'per_head', 'l2_learned_scale'])
def test_model_with_splash_attention_equals_xla_loss_and_gradients(qk_norm):
  """Through the model: QK-norm variants (Henry's learnable scale is a traced scalar)."""
  cfg = tiny_config(**{'model.qk_norm': qk_norm, 'model.num_layers': 1, 'data.seq_len': 128,
                       'model.num_kv_heads': 1})
  params = init_state(make_model(cfg), make_optimizer(cfg), 0, 128)['params']
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 129), 0, cfg.model.vocab_size)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'weights': jnp.ones((2, 128))}
  out = {}
  for kernel in ('splash_interpret', 'xla'):
    model = make_model(tiny_config(**{'model.qk_norm': qk_norm, 'model.num_layers': 1,
                                      'data.seq_len': 128, 'model.num_kv_heads': 1,
                                      'model.attention_kernel': kernel}))
    fn = lambda p, model=model: model_loss(model, None, p, batch, jnp.int32(0),
                                           jax.random.PRNGKey(0))[0]
    out[kernel] = jax.jit(jax.value_and_grad(fn))(params)
  for got, want in zip(jax.tree.leaves(out['splash_interpret']), jax.tree.leaves(out['xla'])):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


SHARDED = '''
import jax, jax.numpy as jnp, numpy as np, flax.linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P
from depthscale.model import ops
mesh = jax.make_mesh((2, 2, 2), ('data', 'fsdp', 'tensor'), axis_types=(jax.sharding.AxisType.Auto,) * 3)
rules = (('batch', ('data', 'fsdp')), ('heads', 'tensor'))
kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
q = jax.random.normal(kq, (4, 128, 4, 8)); k, v = (jax.random.normal(x, (4, 128, 2, 8)) for x in (kk, kv))
f = lambda kernel: jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.sin(ops.attention(q, k, v, 0.5, kernel))), (0, 1, 2)))
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  text = f('splash_interpret').lower(q, k, v).as_text()
  got, want = f('splash_interpret')(q, k, v), f('xla')(q, k, v)
for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
print('OK', 'shard_map' in text or 'sdy.manual_computation' in text)
'''


def test_splash_attention_under_shard_map_on_a_mesh_equals_xla():
  """8 fake devices, batch over data x fsdp, heads (4 query, 2 kv) over tensor."""
  out = subprocess.run([sys.executable, '-c', SHARDED], env=fake_cpu_env(8), capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.split()[-2:] == ['OK', 'True']
