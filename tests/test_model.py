"""Model: scan equals the unrolled loop (rolled or unrolled scan), causality, and the Pre-LN /
Post-LN equations."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from depthscale.config import ConfigError, validate
from depthscale.model.transformer import Transformer, apply_unrolled, make_model
from depthscale.training.steps import init_state
from tests.helpers import covers, tiny_config


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init(model, seed):
  """init_state's parameters (no optimizer changes them), one compiled program per model."""
  return init_state(model, optax.identity(), seed, model.max_len)['params']


def _params(cfg, seed=0):
  return _init(make_model(cfg), seed)


def _tokens(cfg, seed=1):
  return jax.random.randint(jax.random.PRNGKey(seed), (2, cfg.data.seq_len), 0, cfg.model.vocab_size)


@pytest.mark.parametrize('block,position,mlp,kv', [('pre_ln', 'rope', 'gelu', 0),
                                                   ('post_ln', 'learned', 'swiglu', 1)])
def test_scan_equals_unrolled(block, position, mlp, kv):
  cfg = tiny_config(**{'model.block': block, 'model.position': position, 'model.mlp': mlp,
                       'model.num_kv_heads': kv, 'model.tie_embeddings': kv == 0})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  both = lambda p, t: (model.apply({'params': p}, t)[0], apply_unrolled(model, p, t))
  scanned, unrolled = jax.jit(both)(params, tokens)  # one compiled program
  np.testing.assert_allclose(scanned, unrolled, rtol=1e-5, atol=1e-5)


def test_rolled_and_unrolled_layer_scan_compute_the_same_loss_and_gradients():
  """model.unroll_max_layers changes only the compiled loop: straight-line code (no while
  loop) up to that depth, a rolled scan above it."""
  unrolled_cfg = tiny_config()
  rolled_cfg = tiny_config(**{'model.unroll_max_layers': unrolled_cfg.model.num_layers - 1})
  params, tokens = _params(unrolled_cfg), _tokens(unrolled_cfg)
  results = {}
  for name, cfg in (('unrolled', unrolled_cfg), ('rolled', rolled_cfg)):
    model = make_model(cfg)
    loss = lambda p, model=model: jnp.mean(model.apply({'params': p}, tokens)[0] ** 2)
    lowered = jax.jit(jax.value_and_grad(loss)).lower(params)
    assert ('stablehlo.while' in lowered.as_text()) == (name == 'rolled'), name
    results[name] = lowered.compile()(params)
  for got, want in zip(jax.tree.leaves(results['unrolled']), jax.tree.leaves(results['rolled'])):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  with pytest.raises(ConfigError, match='model.unroll_max_layers'):
    validate(tiny_config(**{'model.unroll_max_layers': -2}))


@pytest.mark.parametrize('block', ['pre_ln', 'post_ln'])
def test_causality(block):
  """The loss at position t has zero gradient w.r.t. the input at every position > t."""
  cfg = tiny_config(**{'model.block': block})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  x = model.apply({'params': params}, tokens, method=Transformer.embed)
  t = 5

  def logit_sum_at_t(x):
    out, _ = model.apply({'params': params}, x, method=Transformer.stack)
    return model.apply({'params': params}, out, method=Transformer.unembed)[:, t].sum()

  g = jax.jit(jax.grad(logit_sum_at_t))(x)
  assert np.all(np.asarray(g[:, t + 1:]) == 0)
  assert np.abs(np.asarray(g[:, :t + 1])).sum() > 0


@covers('residual.DESIGNS', 'standard')
@covers('residual.VALUE_RESIDUALS', 'none')
@covers('residual.PARALLEL_BLOCKS', 'none')
def test_pre_ln_zero_branches_is_identity():
  """Pre-LN with W_O = W_down = 0: every block is the identity; logits = head(Norm_f(emb))."""
  cfg = tiny_config(**{'model.block': 'pre_ln'})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)
  params['blocks']['attn']['o'] = jnp.zeros_like(params['blocks']['attn']['o'])
  params['blocks']['mlp']['wo'] = jnp.zeros_like(params['blocks']['mlp']['wo'])
  logits, _ = jax.jit(model.apply)({'params': params}, tokens)
  emb = model.apply({'params': params}, tokens, method=Transformer.embed)
  np.testing.assert_allclose(logits, model.apply({'params': params}, emb, method=Transformer.unembed),
                             rtol=1e-6, atol=1e-6)


def test_post_ln_block_outputs_are_normalized():
  """Post-LN with LN (gain 1, bias 0 at init): each block output has per-token mean 0, var 1."""
  cfg = tiny_config(**{'model.block': 'post_ln', 'model.norm': 'layernorm'})
  model, params, tokens = make_model(cfg), _params(cfg), _tokens(cfg)

  @jax.jit
  def outputs(params):  # the stream leaving block l: the model cut to blocks 1..l, each l
    x = model.apply({'params': params}, tokens, method=Transformer.embed)
    outs = []
    for l in range(1, cfg.model.num_layers + 1):
      sub = cfg.copy_and_resolve_references()
      sub.model.num_layers = l
      p = dict(params, blocks=jax.tree.map(lambda a, l=l: a[:l], params['blocks']))
      outs.append(make_model(sub).apply({'params': p}, x, method=Transformer.stack)[0])
    return outs

  for out in outputs(params):
    out = np.asarray(out, np.float64)
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-3)


def test_post_ln_has_no_final_norm_and_pre_ln_has_one():
  assert 'final_norm' not in _params(tiny_config(**{'model.block': 'post_ln'}))
  assert 'final_norm' in _params(tiny_config(**{'model.block': 'pre_ln'}))


def test_logical_axis_names_on_every_parameter():
  cfg = tiny_config(**{'model.position': 'learned', 'model.tie_embeddings': False})
  boxed = jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), _tokens(cfg))['params']
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: hasattr(x, 'names'))
  assert leaves and all(hasattr(p, 'names') and len(p.names) == p.value.ndim for p in leaves)
  blocks = jax.tree.leaves(boxed['blocks'], is_leaf=lambda x: hasattr(x, 'names'))
  assert all(p.names[0] == 'layers' for p in blocks)
