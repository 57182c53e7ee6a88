"""Shared test helpers: the tiny configs every test starts from, cached inits, single blocks,
and the registry of property tests per method table (tests/test_coverage.py reads it).

Overrides are dotted keys, one style everywhere: tiny_config(**{'model.block': 'post_ln'}).
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from depthscale import data
from depthscale.config import default_config, validate
from depthscale.errors import ConfigError
from depthscale.model.placements import layer_schedule
from depthscale.model.transformer import Block, Transformer, make_model, param_counts
from depthscale.training.steps import make_eval_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COVERED: dict[str, set] = {}  # table name -> entries with a registered property test


def covers(table: str, *entries) -> Callable:
  """Registers the decorated test as the defining-property test of `entries` of `table`."""
  COVERED.setdefault(table, set()).update(entries)
  return lambda fn: fn


def validates_unless(refused: bool, cfg, message: str) -> None:
  """validate(cfg) passes, or, where refused, fails with a ConfigError matching message."""
  if not refused:
    validate(cfg)
    return
  with pytest.raises(ConfigError, match=message):
    validate(cfg)


def fake_cpu_env(devices: int, *flags: str) -> dict:
  """os.environ for a subprocess on `devices` fake CPU devices; the suite's XLA_FLAGS stay."""
  xla = [os.environ.get('XLA_FLAGS', ''), f'--xla_force_host_platform_device_count={devices}', *flags]
  return {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ' '.join(xla).strip()}


def batch_loss(model, batch) -> Callable:
  """params -> mean loss on `batch`, one compiled eval step for every params given."""
  step = jax.jit(make_eval_step(model, []))

  def loss(params) -> float:
    out = step(params, batch)
    return float(out['loss_sum'] / out['weight_sum'])

  return loss


def heldout_batch(cfg):
  """A batch no training step sees: the eval set drawn with seed 1."""
  return data.eval_batches(cfg.data, 1, 1)[0]


def _apply(c, overrides: dict):
  for key, value in overrides.items():
    section, field = key.split('.')
    c[section][field] = value
  return c


def tiny_config(**overrides):
  """The default config made small (sizes and steps), every default path on: analyses and
  images, two eval batches, seq_len 128 (the blocked CPU attention). Seconds per compile."""
  c = default_config()
  c.model.num_layers = 3
  c.model.d_model = 32
  c.model.num_heads = 2
  c.data.batch_size = 4
  c.data.eval_batches = 2
  c.train.steps = 6
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.checkpoint_every = 2
  c.optim.warmup_steps = 2
  c.metrics.analysis_batch_size = 2
  return _apply(c, overrides)


def small_config(**overrides):
  """L=2, D=16, H=2, T=16, B=2 on the grammar data for block-level property tests."""
  c = tiny_config(**{'model.num_layers': 2, 'model.d_model': 16, 'model.num_heads': 2,
                     'data.seq_len': 16, 'data.batch_size': 2, 'data.source': 'grammar'})
  return _apply(c, overrides)


@functools.lru_cache(maxsize=None)
def _init_cached(items: tuple, method: str | None):
  cfg = small_config(**dict(items))
  model = make_model(cfg)
  tokens = jnp.zeros((1, cfg.data.seq_len), jnp.int32)
  fn = getattr(Transformer, method) if method else None
  variables = jax.jit(lambda k: model.init(k, tokens, method=fn))(jax.random.PRNGKey(0))
  return nn.unbox(variables.get('params', {}))


def init(method: str | None = None, **overrides):
  """(model, params) of small_config(**overrides), cached; method: init only e.g. 'embed'."""
  cfg = small_config(**overrides)
  params = _init_cached(tuple(sorted(overrides.items())), method)
  return make_model(cfg), jax.tree.map(jnp.array, params)


def perturb(params, seed: int = 0, scale: float = 0.1):
  """params plus scale * N(0, 1) on every leaf: gains, scales and gates away from their init."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return tree.unflatten([a + scale * jax.random.normal(k, a.shape) for a, k in zip(leaves, keys)])


def param_count(cfg, non_embedding: bool = False) -> int:
  """The parameters of cfg's model (or its non-embedding ones), from abstract shapes
  (nothing initialized)."""
  toks = jax.ShapeDtypeStruct((1, cfg.data.seq_len), jnp.int32)
  return param_counts(nn.unbox(jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0),
                                              toks))['params'])[non_embedding]


def tokens(cfg, seed: int = 1):
  return jax.random.randint(jax.random.PRNGKey(seed), (2, cfg.data.seq_len), 0,
                            cfg.model.vocab_size)


def layer_params(params, l: int):
  """Block l's parameters (0-based) out of the stacked ones."""
  return jax.tree.map(lambda p: p[l], params['blocks'])


def run_block(model, params, x, l: int, capture: bool = False):
  """Block l (0-based) applied to x: its output stream (and captured module outputs)."""
  layer = jax.tree.map(lambda s: s[l], layer_schedule(model.cfg))
  carry = {'x': x}
  if model.cfg.layer_rope:
    carry['layer_rope_gain'] = params['layer_rope_gain']
  if capture:
    (out, _), state = Block(model.cfg).apply({'params': layer_params(params, l)}, carry, layer,
                                             capture_intermediates=True, mutable=['intermediates'])
    return out['x'], state['intermediates']
  out, _ = Block(model.cfg).apply({'params': layer_params(params, l)}, carry, layer)
  return out['x']


def block_outputs(model, params, toks):
  """The stream leaving each block, block 1 first (a Python loop over blocks)."""
  x = model.apply({'params': params}, toks, method=Transformer.embed)
  outs = []
  for l in range(model.cfg.num_layers):
    x = run_block(model, params, x, l)
    outs.append(x)
  return x, outs


def token_rms(x):
  return jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1))
