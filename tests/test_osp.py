"""Outlier-safe pre-training (Park et al. 2025): Muon on the matrices (per 2-D matrix, per
layer of the scanned stack) with AdamW on the rest, single-scale RMSNorm, the embedding
projection; each against a float64 numpy reference away from init."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model import norms
from depthscale.model.param_tree import path_str
from depthscale.model.transformer import Transformer
from depthscale.training.optim import make_optimizer
from tests.helpers import covers, init, perturb, small_config, tokens

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # optax's (and Keller Jordan's) quintic iteration
LR, WD, STEPS = 0.01, 0.1, 3
MATRICES = ('q', 'kv', 'o', 'wi', 'wo', 'embed_proj', 'head_proj')
OSP = {'model.norm': 'ss_rmsnorm', 'model.embed_projection': True, 'model.mlp': 'swiglu',
       'model.tie_embeddings': False}


def _newton_schulz(g: np.ndarray, steps: int = 5) -> np.ndarray:
  """Five quintic Newton-Schulz steps on the Frobenius-normalized matrix (wide orientation)."""
  a, b, c = NS_COEFFS
  x = g.T if g.shape[0] > g.shape[1] else g
  x = x / (np.linalg.norm(x) + 1e-8)
  for _ in range(steps):
    s = x @ x.T
    x = a * x + (b * s + c * s @ s) @ x
  return x.T if g.shape[0] > g.shape[1] else x


def _matrices(name: str, p: np.ndarray) -> list[tuple[tuple, np.ndarray]]:
  """(index, 2-D fan_in x fan_out matrix) of every separate matrix in leaf `name`."""
  if name in ('embed_proj', 'head_proj'):
    return [((), p)]
  out = []
  for l in range(p.shape[0]):
    if name == 'q':
      out.append(((l,), p[l].reshape(p.shape[1], -1)))
    elif name == 'o':
      out.append(((l,), p[l].reshape(-1, p.shape[-1])))
    elif name == 'wo':
      out.append(((l,), p[l]))
    else:  # kv (D, 2, K, E): W_K, W_V; SwiGLU's wi (D, 2, F): W_gate, W_up
      out += [((l, slice(None), i), p[l][:, i].reshape(p.shape[1], -1)) for i in range(2)]
  return out


def _muon_direction(name: str, m: np.ndarray) -> np.ndarray:
  """Orthogonalized momentum of every matrix, scaled to RMS 0.2 * sqrt(max(fan_in, fan_out))
  / sqrt(min(...)) as optim.muon_rms = 0.2 does."""
  out = np.zeros_like(m)
  for idx, mat in _matrices(name, m):
    u = _newton_schulz(mat) * 0.2 * np.sqrt(max(mat.shape))
    out[idx] = u.reshape(out[idx].shape)
  return out


@functools.lru_cache(maxsize=None)
def _run(name: str):
  """STEPS optimizer updates on random gradients from perturbed params: per leaf path, the
  updates, the float64 reference's and (Muon's matrices) the Nesterov momentum."""
  cfg = small_config(**OSP, **{'optim.name': name, 'optim.lr': LR, 'optim.schedule': 'constant',
                               'optim.warmup_steps': 0, 'optim.clip_norm': 0.0,
                               'optim.weight_decay': WD, 'optim.decay_embeddings': True})
  validate(cfg)
  _, params = init(**OSP)
  params = perturb(params, seed=3)
  tx = make_optimizer(cfg)
  state, update = tx.init(params), jax.jit(tx.update)
  o = cfg.optim
  flat = {path_str(k): np.asarray(v, np.float64) for k, v in
          jax.tree_util.tree_flatten_with_path(params)[0]}
  moments = {k: [np.zeros_like(v), np.zeros_like(v)] for k, v in flat.items()}
  got, want, momenta = {k: [] for k in flat}, {k: [] for k in flat}, {}
  for t in range(1, STEPS + 1):
    keys = jax.random.split(jax.random.PRNGKey(t), len(flat))
    grads = jax.tree.unflatten(jax.tree.structure(params), [
        jax.random.normal(k, p.shape) for k, p in zip(keys, jax.tree.leaves(params))])
    updates, state = update(grads, state, params)
    flat_updates = jax.tree_util.tree_flatten_with_path(updates)[0]
    for (path, u), g in zip(flat_updates, jax.tree.leaves(grads)):
      k, g = path_str(path), np.asarray(g, np.float64)
      leaf, p, (m, v) = k.split('/')[-1], flat[k], moments[k]
      if name == 'muon' and leaf in MATRICES:
        b = o.muon_beta  # Nesterov momentum with optax's bias corrections
        m[...] = b * m + (1 - b) * g
        nesterov = b * m / (1 - b ** (t + 1)) + (1 - b) * g / (1 - b ** t)
        ref = -LR * (_muon_direction(leaf, nesterov) + WD * p)
        momenta.setdefault(k, []).append(nesterov)
      else:  # AdamW: decoupled decay on matrices and (decay_embeddings) embeddings only
        m[...] = o.b1 * m + (1 - o.b1) * g
        v[...] = o.b2 * v + (1 - o.b2) * g * g
        adam = (m / (1 - o.b1 ** t)) / (np.sqrt(v / (1 - o.b2 ** t)) + o.eps)
        decays = leaf in MATRICES + ('embedding', 'head')
        ref = -LR * (adam + (WD * p if decays else 0.0))
      got[k].append(np.asarray(u, np.float64))
      want[k].append(ref)
      flat[k] = p + ref
    params = optax.apply_updates(params, updates)
  return got, want, momenta


@covers('optim.OPTIMIZERS', 'adamw', 'muon')
@pytest.mark.parametrize('name', ['adamw', 'muon'])
def test_updates_match_the_float64_muon_and_adamw_references(name):
  """Muon's update per matrix of every layer (and of K/V, gate/up separately) is the
  Newton-Schulz orthogonalized Nesterov momentum at RMS 0.2 plus decay; embeddings, head
  and norm scales keep AdamW; with optim.name=adamw everything is AdamW."""
  got, want, _ = _run(name)
  assert len(got) == 12
  for k in got:
    for t, (g, w) in enumerate(zip(got[k], want[k])):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * np.abs(w).max(),
                                 err_msg=f'{k} step {t}')


def test_muon_orthogonalizes_each_layer_not_the_stack():
  """The per-layer reference above is not what orthogonalizing each stacked 3-D parameter
  as one (L * fan_in, fan_out) matrix gives: the test tells the two apart."""
  _, want, momenta = _run('muon')
  for k in ('blocks/mlp/wo', 'blocks/attn/q'):
    m = momenta[k][-1]
    per_layer = _muon_direction(k.split('/')[-1], m)
    stacked = _newton_schulz(m.reshape(-1, m.shape[-1]))  # q: (L * D * H, E), also wrong
    stacked = stacked.reshape(m.shape) * 0.2 * np.sqrt(max(stacked.shape))
    assert np.abs(stacked - per_layer).max() > 0.1 * np.abs(per_layer).max(), k


@covers('norms.NORMS', 'ss_rmsnorm')
def test_single_scale_rmsnorm_is_x_over_rms_times_one_scalar():
  norm = norms.SingleScaleRMSNorm(eps=1e-5)
  x = np.random.default_rng(0).normal(size=(2, 5, 16)) * np.linspace(0.1, 8, 16)
  params = norm.init(jax.random.PRNGKey(0), jnp.asarray(x, jnp.float32))['params']
  assert jax.tree.map(jnp.shape, params) == {'scale': ()}
  s = 1.7
  y = norm.apply({'params': {'scale': jnp.float32(s)}}, jnp.asarray(x, jnp.float32))
  ref = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * s
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_embedding_projection_is_e_at_p_in_and_head_reads_through_p_out():
  model, params = init(**OSP)
  for key in ('embed_proj', 'head_proj'):  # orthogonal at init
    np.testing.assert_allclose(params[key].T @ params[key], np.eye(16), atol=1e-5)
  params = perturb(params, seed=1, scale=0.3)
  toks = tokens(small_config(**OSP))
  x = model.apply({'params': params}, toks, method=Transformer.embed)
  e, p_in = (np.asarray(params[k], np.float64) for k in ('embedding', 'embed_proj'))
  np.testing.assert_allclose(x, e[np.asarray(toks)] @ p_in, rtol=1e-5, atol=1e-5)
  logits = model.apply({'params': params}, x, method=Transformer.unembed)
  x64 = np.asarray(x, np.float64)
  s = float(params['final_norm']['scale'])
  normed = x64 / np.sqrt(np.mean(x64 * x64, -1, keepdims=True) + 1e-5) * s
  p_out, head = (np.asarray(params[k], np.float64) for k in ('head_proj', 'head'))
  ref = normed @ p_out @ head
  np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('overrides, message', [
    ({'optim.name': 'sgd'}, "optim.name='sgd' is invalid: allowed one of adamw, muon"),
    ({'optim.name': 'muon', 'model.parametrization': 'mup'}, "optim.name='muon' is invalid: allowed"
     " 'adamw' with model.parametrization=mup"),
    ({'optim.muon_beta': 1.0}, 'optim.muon_beta=1.0 is invalid: allowed a number in [0, 1)'),
    ({'optim.muon_ns_steps': 0}, 'optim.muon_ns_steps=0 is invalid: allowed a positive integer'),
    ({'optim.muon_rms': 0.0}, 'optim.muon_rms=0.0 is invalid: allowed a positive number'),
    ({'model.embed_projection': True, 'model.block': 'ngpt', 'model.mlp': 'swiglu',
      'model.tie_embeddings': False}, 'model.embed_projection=True is invalid: allowed False with'
     ' model.block=ngpt'),
    ({'optim.name': 'muon', 'model.mlp_taper': 'cosine'}, "optim.name='muon' is invalid: allowed"
     " 'adamw' with model.mlp_taper=cosine"),
])
def test_bad_osp_settings_fail_in_one_line(overrides, message):
  with pytest.raises(ConfigError) as e:
    validate(small_config(**overrides))
  assert str(e.value).startswith(message) and '\n' not in str(e.value)
