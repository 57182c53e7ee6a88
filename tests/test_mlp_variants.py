"""MLP activations (GELU, ReLU, squared ReLU, SwiGLU) and tapered MLP widths, against float64
numpy references away from init: the taper's widths follow the cosine and keep the uniform
budget, and a block's masked MLP is the MLP of its narrower width."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model import ops, taper
from depthscale.model.transformer import Mlp, make_model
from tests.helpers import covers, param_count, perturb, small_config

D = 16


def _act64(kind: str, u):
  """The activations by their formulas, float64."""
  if kind == 'gelu':
    return 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
  relu = np.maximum(u, 0.0)
  return relu if kind == 'relu' else relu * relu


def _mlp64(kind: str, p, x, width: int | None = None):
  """W_out act(W_in x) with the first `width` hidden units only (SwiGLU: silu(gate) * up)."""
  wi, wo = (np.asarray(p[k], np.float64) for k in ('wi', 'wo'))
  width = wo.shape[0] if width is None else width
  x = np.asarray(x, np.float64)
  if kind == 'swiglu':
    g, u = (x @ wi[:, i, :width] for i in (0, 1))
    h = g / (1 + np.exp(-g)) * u
  else:
    h = _act64(kind, x @ wi[:, :width])
  return h @ wo[:width]


def _x(seed=0):
  return 2.0 * jax.random.normal(jax.random.PRNGKey(seed), (2, 8, D))


def _mlp(**over):
  """(model config, one block's MLP params away from init) of small_config(**over)."""
  cfg = make_model(small_config(**over)).cfg
  params = nn.unbox(Mlp(cfg).init(jax.random.PRNGKey(0), _x(), index=1)['params'])
  return cfg, perturb(params, seed=2)


@covers('ops.MLPS', *ops.MLPS)
@pytest.mark.parametrize('kind', ops.MLPS)
def test_mlp_matches_its_float64_formula(kind):
  cfg, p = _mlp(**{'model.mlp': kind})
  out = Mlp(cfg).apply({'params': p}, _x(), index=2)
  np.testing.assert_allclose(out, _mlp64(kind, p, _x()), rtol=1e-4, atol=1e-5)


def _cosine64(f: int, num_layers: int, r: float) -> np.ndarray:
  """The taper's formula: r F at block 1 down to (2 - r) F at block L, a half cosine."""
  t = np.arange(num_layers) / (num_layers - 1)
  return np.array([f * (2 - r + (r - 1) * (1 + math.cos(math.pi * s))) for s in t])


@covers('taper.TAPERS', *taper.TAPERS)
@pytest.mark.parametrize('num_layers,d_ff,ratio', [(2, 64, 1.5), (5, 100, 1.5), (12, 48, 1.25),
                                                   (7, 33, 1.9)])
def test_taper_widths_follow_the_cosine_and_keep_the_uniform_budget(num_layers, d_ff, ratio):
  cfg = small_config(**{'model.num_layers': num_layers, 'model.d_ff': d_ff,
                        'model.mlp_taper_ratio': ratio}).model
  assert list(taper.widths(cfg)) == [d_ff] * num_layers  # model.mlp_taper='none'
  cfg.mlp_taper = 'cosine'
  f, ideal = taper.widths(cfg), _cosine64(d_ff, num_layers, ratio)
  assert f.sum() == num_layers * d_ff and np.all(np.abs(f - ideal) < 1)
  assert np.all(np.diff(f) <= 0) and taper.param_width(cfg) == f[0]
  cfg.mlp_taper = 'reverse'
  assert list(taper.widths(cfg)) == list(f[::-1])


@pytest.mark.parametrize('kind,schedule', [('relu2', 'cosine'), ('swiglu', 'reverse')])
def test_masked_mlp_equals_the_narrower_float64_mlp_and_counts_active_units(kind, schedule):
  """Block l's MLP (params of width max f, units >= f_l masked) equals W_out act(W_in x) with
  the f_l first units; the masked units get no gradient; the counted parameters are those
  of the uniform model."""
  over = {'model.mlp': kind, 'model.mlp_taper': schedule, 'model.num_layers': 3}
  cfg, p = _mlp(**over)
  f = taper.widths(cfg)
  assert p['wo'].shape[0] == f.max() > min(f)
  x = _x(1)
  for l in range(cfg.num_layers):
    apply = lambda q, l=l: Mlp(cfg).apply({'params': q}, x, index=l + 1)
    np.testing.assert_allclose(apply(p), _mlp64(kind, p, x, int(f[l])), rtol=1e-4, atol=1e-5)
    grads = jax.grad(lambda q: jnp.sum(jnp.sin(apply(q))))(p)
    assert not np.any(grads['wo'][f[l]:]) and not np.any(grads['wi'][..., f[l]:])
    assert np.all(np.any(grads['wo'][:f[l]] != 0, axis=-1))
  uniform = small_config(**{**over, 'model.mlp_taper': 'none'})
  assert (param_count(small_config(**over)) - taper.inactive_params(cfg)
          == param_count(uniform))


@pytest.mark.parametrize('over,field', [
    ({'model.mlp': 'silu'}, 'model.mlp'),
    ({'model.mlp_taper': 'linear'}, 'model.mlp_taper'),
    ({'model.mlp_taper': 'cosine', 'model.mlp_taper_ratio': 2.0}, 'model.mlp_taper_ratio'),
    ({'model.mlp_taper': 'cosine', 'model.block': 'sub_ln'}, 'model.mlp_taper'),
    ({'model.mlp_taper': 'cosine', 'model.d_ff': 2, 'model.mlp_taper_ratio': 1.9,
      'model.num_layers': 4}, 'model.mlp_taper_ratio'),
])
def test_bad_mlp_fields_fail_in_one_line_naming_the_field(over, field):
  with pytest.raises(ConfigError, match=f'^{field}=.* is invalid: allowed ') as err:
    validate(small_config(**over))
  assert '\n' not in str(err.value)
