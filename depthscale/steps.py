"""Pure, jittable functions of training: state init, the train step (plain or with
per-layer statistics) and the eval step."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from depthscale.stats import per_layer_norm, saturation_per_layer

State = dict  # {'step': int32, 'params', 'opt_state', 'rng'}


def init_state(model: nn.Module, tx: optax.GradientTransformation, seed: int, seq_len: int) -> State:
  """Fresh parameters (unboxed from their logical-axis metadata) and optimizer state."""
  rng = jax.random.PRNGKey(seed)
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  params = nn.unbox(model.init(jax.random.fold_in(rng, 0), tokens)['params'])
  return {'step': jnp.zeros((), jnp.int32), 'params': params,
          'opt_state': tx.init(params), 'rng': rng}


def weighted_loss(logits_BxTxV, batch) -> jax.Array:
  """Mean cross-entropy over target positions with weight 1 (weights in batch)."""
  ce_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch['targets'])
  w_BxT = batch['weights']
  return jnp.sum(ce_BxT * w_BxT) / jnp.maximum(jnp.sum(w_BxT), 1.0)


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    lr_fn: Callable) -> Callable:
  """state, batch -> (state, out). If the model collects statistics (the logging-step
  path), out['layers'] holds them plus the per-layer gradient, parameter and update
  norms, and out has the global 'param_norm' and 'logit_max'; the plain step computes
  none of it. A non-finite loss or gradient leaves the state unchanged and sets
  out['ok'] to False; out['layer_grad_norm'] then names the first block whose gradient
  is non-finite."""

  def loss_fn(params, batch):
    if not model.collect_stats:
      logits, _ = model.apply({'params': params}, batch['inputs'])
      return weighted_loss(logits, batch), {}
    (logits, stats), sown = model.apply({'params': params}, batch['inputs'],
                                        mutable=['intermediates'])
    stats = {**stats, **saturation_per_layer(sown.get('intermediates', {}))}
    return weighted_loss(logits, batch), {'layers': stats, 'logit_max': jnp.max(logits)}

  def step(state: State, batch) -> tuple[State, dict]:
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'], batch)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    layer_grad_norm = per_layer_norm(grads['blocks'])
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = {'step': state['step'] + 1, 'params': keep(params, state['params']),
                 'opt_state': keep(opt_state, state['opt_state']), 'rng': state['rng']}
    out = {'loss': loss, 'grad_norm': grad_norm, 'ok': ok, 'lr': lr_fn(state['step']),
           'layer_grad_norm': layer_grad_norm}
    if aux:
      out.update(logit_max=aux['logit_max'], param_norm=optax.tree.norm(state['params']),
                 layers={**aux['layers'], **update_stats(state['params'], grads, updates),
                         'grad_norm': layer_grad_norm})
    return new_state, out

  return step


def update_stats(params, grads, updates) -> dict[str, jax.Array]:
  """Per layer: gradient norms of the attention and MLP sublayers, parameter norm ||W||
  and update_param_ratio ||delta W|| / ||W|| of the optimizer update (before it is applied)."""
  param_norm = per_layer_norm(params['blocks'])
  return {'grad_norm_attn': per_layer_norm(grads['blocks']['attn']),
          'grad_norm_mlp': per_layer_norm(grads['blocks']['mlp']),
          'param_norm': param_norm,
          'update_param_ratio': per_layer_norm(updates['blocks']) / jnp.maximum(param_norm, 1e-30)}


def make_eval_step(model: nn.Module, hops: list[int]) -> Callable:
  """params, batch -> sums of weighted loss and, per k-hop value, answer accuracy counts."""

  def step(params, batch) -> dict:
    logits, _ = model.apply({'params': params}, batch['inputs'])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
    correct = jnp.argmax(logits, -1) == batch['targets']
    at_hop = [batch['hop'] == k for k in hops]
    return {'loss_sum': jnp.sum(ce * batch['weights']), 'weight_sum': jnp.sum(batch['weights']),
            'correct': jnp.array([jnp.sum(correct & m) for m in at_hop], jnp.float32),
            'count': jnp.array([jnp.sum(m) for m in at_hop], jnp.float32)}

  return step
