"""Depth by recurrence (model.loops) and relaxed recursion (model.loop_lora_rank): K loops of
the shared Pre-LN block equal a float64 numpy block applied K times with the same weights
(loop k with W + B_k A_k), off init; the parameter count does not depend on K and grows by
exactly the LoRA factors; the shared weights' gradient is the sum over loops of the untied
model's per-layer gradients (and matches a finite difference); bad combinations fail in
validation; (slow tier) a tiny recurrent model trains through the whole loop with per-layer
metrics of the effective depth."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale import config
from depthscale.errors import ConfigError
from depthscale.model import recurrence
from depthscale.model.transformer import Transformer, apply_unrolled, make_model, param_counts
from depthscale.storage import read_jsonl
from depthscale.training import dryrun
from depthscale.training.loop import train_rung
from tests.helpers import init, param_count, perturb, small_config, tiny_config
from tests.test_method_properties import _causal_attention64, _out64, _qkv64, _rope64

LOOPS = {'model.num_layers': 6, 'model.loops': 3}  # U = 2 unique blocks, effective depth 6


def _ln64(p, x, eps=1e-5):
  mean = x.mean(-1, keepdims=True)
  var = np.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _attention64(p, x):
  """Causal RoPE attention with softmax scale 1/sqrt(E), float64."""
  q, k, v = _qkv64(x, p)
  q, k = _rope64(q, 10000.0), _rope64(k, 10000.0)
  return _out64(_causal_attention64(q / math.sqrt(q.shape[-1]), k, v), p)


def _mlp64(p, x):
  h = x @ p['wi']
  return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))) @ p['wo']


def _block64(p, x):
  """Pre-LN: x + Attn(LN(x)), then x + MLP(LN(x))."""
  x = x + _attention64(p['attn'], _ln64(p['attn_norm'], x))
  return x + _mlp64(p['mlp'], _ln64(p['mlp_norm'], x))


def _lora64(a_PxRxI, b_PxOxR, shape):
  """sum of B_p A_p per part, laid out (fan_in, part, fan_out) and reshaped to the matrix."""
  return np.einsum('por,pri->ipo', b_PxOxR, a_PxRxI).reshape(shape)


def _stack64(params, x, loops):
  """The recurrent stack in numpy: loop k applies unique block u with W + B_ku A_ku."""
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  blocks, lora = p64['blocks'], p64.get('loop_lora', {})
  units = len(blocks['attn']['q'])
  for k in range(loops):
    for u in range(units):
      p = jax.tree.map(lambda a: a[u], blocks)
      for sub in ('attn', 'mlp'):
        for name in p[sub]:
          key = f'{sub}_{name}'
          if key + '_a' in lora:
            w = p[sub][name]
            p[sub][name] = w + _lora64(lora[key + '_a'][k, u], lora[key + '_b'][k, u], w.shape)
      x = _block64(p, x)
  return x


@pytest.mark.parametrize('rank', [0, 2])
def test_k_loops_equal_the_numpy_block_applied_k_times(rank):
  model, params = init(**LOOPS, **{'model.loop_lora_rank': rank})
  params = perturb(params, seed=5, scale=0.3)  # every LoRA B nonzero: loops differ
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 16, 16))
  out, _ = jax.jit(lambda p, x: model.apply({'params': p}, x, method=Transformer.stack))(params, x)
  expected = _stack64(params, np.asarray(x, np.float64), 3)
  np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=2e-4, atol=2e-4)
  if rank:  # the LoRA matters: without it the output moves far beyond the tolerance
    plain = _stack64({'blocks': params['blocks']}, np.asarray(x, np.float64), 3)
    assert np.max(np.abs(plain - expected)) > 1e-2


@pytest.mark.parametrize('overrides', [
    {'model.residual': 'hyper_connections', 'model.value_residual': 'satformer'},
    {'model.residual': 'laurel', 'model.laurel': 'pa', 'model.remat': 'nothing_saveable'},
    {'model.moda': True, 'model.block': 'mix_ln', 'model.unroll_max_layers': 0},
], ids=['hc+satformer', 'laurel_pa+remat', 'moda+mix_ln+rolled'])
def test_loop_scan_equals_the_python_loop_over_effective_blocks(overrides):
  """The designs that compose: carry state (streams, V_1, LAuReL's window, MoDA's depth
  stream) runs through the nested loop scan as through L untied blocks in a Python loop."""
  model, params = init(**LOOPS, **{'model.loop_lora_rank': 2, **overrides})
  params = perturb(params, seed=11, scale=0.1)
  tokens = jax.random.randint(jax.random.PRNGKey(4), (2, 16), 0, 256)
  scanned, _ = jax.jit(model.apply)({'params': params}, tokens)
  unrolled = jax.jit(lambda p, t: apply_unrolled(model, p, t))(params, tokens)
  np.testing.assert_allclose(scanned, unrolled, rtol=1e-4, atol=1e-4)


def test_parameters_do_not_depend_on_loops_and_grow_by_the_lora_factors():
  d, f, r, units = 16, 64, 2, 2
  counts = {k: param_count(small_config(**{'model.num_layers': units * k, 'model.loops': k}))
            for k in (1, 2, 4)}
  assert counts[1] == counts[2] == counts[4], counts
  # per block: q (D -> D), k and v (D -> D each), o (D -> D), in (D -> F), out (F -> D)
  per_loop_block = r * (4 * (d + d) + (d + f) + (f + d))
  for k, mlp in ((2, 'gelu'), (4, 'swiglu')):
    over = {'model.num_layers': units * k, 'model.loops': k, 'model.mlp': mlp}
    base = param_count(small_config(**over))
    extra = per_loop_block + (r * (d + f) if mlp == 'swiglu' else 0)  # gate and up: one each
    assert param_count(small_config(**over, **{'model.loop_lora_rank': r})) - base == (
        k * units * extra)


def test_compute_params_count_a_looped_block_once_per_loop():
  """Training FLOPs use compute_params: a K-loop model (with or without LoRA, merged before the
  matmuls) passes each token through as many weights as the untied model of its depth."""
  def counts(**over):
    cfg = small_config(**over)
    toks = jax.ShapeDtypeStruct((1, cfg.data.seq_len), jnp.int32)
    params = nn.unbox(jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), toks))['params']
    non_embedding = param_counts(params)[1]
    return non_embedding, recurrence.compute_params(cfg.model, params, non_embedding)
  untied = counts(**{'model.num_layers': 6})
  assert untied[1] == untied[0]
  for rank in (0, 2):
    looped = counts(**LOOPS, **{'model.loop_lora_rank': rank})
    assert looped[1] == untied[0] and (looped[0] < untied[0])


def test_lora_factors_name_the_fsdp_and_tensor_axes_of_their_matrix():
  """Each factor carries 'embed' and 'heads' or 'mlp' (the rank axis takes the side it lacks),
  so an fsdp x tensor mesh cuts it like its matrix (a 2 x 2 mesh with every parameter over
  64 elements sharded ran two steps and the analyses)."""
  cfg = small_config(**LOOPS, **{'model.loop_lora_rank': 2})
  toks = jax.ShapeDtypeStruct((1, cfg.data.seq_len), jnp.int32)
  boxed = jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), toks)['params']['loop_lora']
  for name, leaf in boxed.items():
    assert leaf.names[:2] == (None, 'layers') and 'embed' in leaf.names, (name, leaf.names)
    assert ('mlp' if name.startswith('mlp') else 'heads') in leaf.names, (name, leaf.names)


def _loss(model, tokens):
  return lambda p: jnp.mean(jnp.square(model.apply({'params': p}, tokens)[0]))


def test_shared_gradient_is_the_sum_over_loops_of_the_untied_gradients():
  model, params = init(**LOOPS)
  params = perturb(params, seed=7, scale=0.1)
  untied = make_model(small_config(**{'model.num_layers': 6}))  # the same depth, no tying
  tokens = jax.random.randint(jax.random.PRNGKey(3), (2, 16), 0, 256)
  grad = jax.jit(jax.grad(_loss(model, tokens)))(params)['blocks']
  tiled = {**params, 'blocks': jax.jit(lambda p: recurrence.effective_blocks(model.cfg, p))(params)}
  grad_untied = jax.jit(jax.grad(_loss(untied, tokens)))(tiled)['blocks']
  summed = jax.tree.map(lambda g: np.asarray(g).reshape((3, 2) + g.shape[1:]).sum(0), grad_untied)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grad, summed)
  # one coordinate by a central difference (float32, a smooth loss: 1% agreement)
  eps, loss, blocks = 1e-2, jax.jit(_loss(model, tokens)), params['blocks']

  def bumped(s):
    wo = blocks['mlp']['wo'].at[1, 3, 5].add(s)
    return {**params, 'blocks': {**blocks, 'mlp': {**blocks['mlp'], 'wo': wo}}}
  fd = (loss(bumped(eps)) - loss(bumped(-eps))) / (2 * eps)
  np.testing.assert_allclose(fd, grad['mlp']['wo'][1, 3, 5], rtol=1e-2)


@pytest.mark.parametrize('overrides, field', [
    ({'model.loops': 4}, 'model.loops'),
    ({'model.loop_lora_rank': 2}, 'model.loop_lora_rank'),
    ({**LOOPS, 'model.residual': 'denseformer'}, 'model.residual'),
    ({**LOOPS, 'optim.qk_slow_factor': 0.5}, 'optim.qk_slow_factor'),
    ({**LOOPS, 'model.loop_lora_rank': 2, 'model.block': 'ngpt', 'model.mlp': 'swiglu'},
     'model.loop_lora_rank'),
    ({**LOOPS, 'model.mlp_taper': 'cosine'}, 'model.mlp_taper'),
    ({**LOOPS, 'posthoc.prune_layers': 1, 'posthoc.init_from': 'source'}, 'posthoc.prune_layers'),
    ({**LOOPS, 'model.loop_lora_rank': 2, 'optim.name': 'muon'}, 'optim.name'),
])
def test_bad_combinations_fail_in_validation_on_one_line(overrides, field):
  with pytest.raises(ConfigError) as err:
    config.validate(small_config(**overrides))
  assert str(err.value).startswith(field) and '\n' not in str(err.value)


def test_flops_count_every_loop_as_the_unrolled_program_does():
  """XLA's count of the unrolled recurrent program = the dry run's layer-scaled cost (probes
  compiled untied) = the analytic count with the block matmuls once per loop."""
  cfg = tiny_config(**{'model.d_model': 32, 'model.num_layers': 4, 'model.loops': 2,
                       'model.loop_lora_rank': 2, 'data.seq_len': 32, 'model.vocab_size': 64,
                       'model.attention_kernel': 'xla', 'model.unroll_max_layers': 4})
  compiled, plan, _ = dryrun.compile_step(cfg, False)
  unrolled, _ = dryrun.cost(compiled)
  assert dryrun.layer_scaled_cost(cfg)[0] == pytest.approx(unrolled, rel=0.05)
  assert dryrun.model_flops(cfg, plan.abstract_state['params']) == pytest.approx(unrolled, rel=0.15)


@pytest.mark.slow  # a training run through the whole loop
def test_tiny_recurrent_model_trains_with_per_effective_layer_metrics(tmp_path):
  cfg = tiny_config(**{'model.num_layers': 4, 'model.loops': 2, 'model.loop_lora_rank': 2,
                       'train.steps': 8, 'train.log_every': 4, 'train.eval_every': 8,
                       'train.checkpoint_every': 8, 'metrics.analysis_every': 8,
                       'metrics.images': False, 'optim.lr': 1e-2})
  train_rung(cfg, str(tmp_path))
  losses = [r['train/loss'] for r in read_jsonl(tmp_path / 'train_log.jsonl')]
  assert losses[-1] < losses[0] - 0.5, losses
  layers = read_jsonl(tmp_path / 'layer_metrics.jsonl')
  assert all(len(v) == 4 for r in layers for k, v in r.items() if k != 'step')
  grad = layers[0]['grad_norm']  # the shared blocks' gradient, once per loop
  assert grad[:2] == grad[2:] and 'skip_delta_loss' in layers[-1]
