"""Pure, jittable functions of training: state init, the train step (plain or with
per-layer statistics) and the eval step."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from depthscale.stats import per_layer_norm

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
  """state, batch -> (state, out). If the model collects statistics, out['layers']
  holds them plus the per-layer gradient norm. A non-finite loss or gradient leaves
  the state unchanged and sets out['ok'] to False; out['layer_grad_norm'] then names
  the first block whose gradient is non-finite."""

  def step(state: State, batch) -> tuple[State, dict]:
    def loss_fn(params):
      logits, stats = model.apply({'params': params}, batch['inputs'])
      return weighted_loss(logits, batch), stats

    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
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
    if stats:
      out['layers'] = {**stats, 'grad_norm': layer_grad_norm}
    return new_state, out

  return step


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
