"""Shared helpers of the normalization tests: tiny configs, cached inits, single blocks."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthscale.model.placements import layer_schedule
from depthscale.model.transformer import Block, Transformer, make_model
from tests.helpers import tiny_config


def small_config(**model_overrides):
  """L=2, D=16, H=2, T=16, B=2 on the grammar data; keyword arguments override model fields."""
  c = tiny_config(**{'model.num_layers': 2, 'model.d_model': 16, 'model.num_heads': 2,
                     'data.seq_len': 16, 'data.batch_size': 2, 'data.source': 'grammar'})
  for k, v in model_overrides.items():
    c.model[k] = v
  return c


@functools.lru_cache(maxsize=None)
def _init_cached(items: tuple, method: str | None):
  cfg = small_config(**dict(items))
  model = make_model(cfg)
  tokens = jnp.zeros((1, cfg.data.seq_len), jnp.int32)
  fn = getattr(Transformer, method) if method else None
  variables = jax.jit(lambda k: model.init(k, tokens, method=fn))(jax.random.PRNGKey(0))
  return nn.unbox(variables.get('params', {}))


def init(method: str | None = None, **model_overrides):
  """(model, params) of small_config(**model_overrides), cached; method: init only e.g. 'embed'."""
  cfg = small_config(**model_overrides)
  params = _init_cached(tuple(sorted(model_overrides.items())), method)
  return make_model(cfg), jax.tree.map(jnp.array, params)


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
