"""Pure, jittable functions of training: state init, the train step (plain or with
per-layer statistics) and the eval step."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from depthscale.model.recurrence import per_effective_layer
from depthscale.model.stats import per_layer_norm, saturation_per_layer
from depthscale.training import dynamics

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


def early_exit_weights(num_layers: int, e_scale: float) -> jax.Array:
  """LayerSkip's normalized exit weights (paper): e(l) = e_scale * sum_{i<=l} i for l < L-1,
  e(L-1) = L-1 + e_scale * sum_{i<=L-2} i (l 0-based), divided by their sum."""
  l = jnp.arange(num_layers, dtype=jnp.float32)
  e = e_scale * l * (l + 1) / 2
  e = e.at[-1].set(num_layers - 1 + e_scale * (num_layers - 2) * (num_layers - 1) / 2)
  return e / jnp.maximum(jnp.sum(e), 1e-30)


def model_loss(model: nn.Module, cfg, params, batch, step, rng, train: bool = True):
  """(loss, aux): the LM loss under the step's dynamic per-layer inputs (cfg = full config;
  None: none) plus, with train.early_exit_scale, LayerSkip's early-exit loss. aux holds
  the per-layer statistics and logit max when the model collects statistics, else {}."""
  inputs = None if cfg is None else dynamics.layer_inputs(cfg, step, rng, batch['inputs'].shape[0],
                                                          train)
  early = cfg is not None and train and cfg.train.early_exit_scale > 0
  if not (model.collect_stats or early):
    logits, _ = model.apply({'params': params}, batch['inputs'], inputs, batch.get('segments'))
    return weighted_loss(logits, batch), {}
  (logits, stats), sown = model.apply({'params': params}, batch['inputs'], inputs,
                                      batch.get('segments'), mutable=['intermediates'])
  sown = sown.get('intermediates', {})
  loss = weighted_loss(logits, batch)
  if early:
    x_LxBxTxD = sown['blocks']['x_out'][0]
    w = early_exit_weights(cfg.model.num_layers, cfg.train.early_exit_scale)
    exit_loss = jax.vmap(lambda x: weighted_loss(model.apply({'params': params}, x,
                                                             method='unembed'), batch))(x_LxBxTxD[:-1])
    loss = jnp.sum(w[:-1] * exit_loss) + w[-1] * loss
  if not model.collect_stats:
    return loss, {}
  return loss, {'layers': {**stats, **saturation_per_layer(sown)},
                'logit_max': jnp.max(logits)}


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    lr_fn: Callable, cfg=None) -> Callable:
  """state, batch[, lr] -> (state, out); lr: the peak learning rate as an array, passed to
  tx.update and lr_fn(step, lr) (None: lr_fn's own peak, a constant of the program). If the
  model collects statistics (the logging-step path), out['layers'] holds them plus the
  per-layer gradient, parameter and update norms, and out has the global 'param_norm' and
  'logit_max'; the plain step computes none of it. A non-finite loss or gradient leaves the
  state unchanged and sets out['ok'] to False; out['layer_grad_norm'] then names the first
  block whose gradient is non-finite. cfg (the full config) enables the training-dynamics
  methods of depthscale.dynamics."""

  def step(state: State, batch, lr=None) -> tuple[State, dict]:
    def loss_fn(params):
      return model_loss(model, cfg, params, batch, state['step'], state['rng'])

    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'], lr=lr)
    params = optax.apply_updates(state['params'], updates)
    layer_grad_norm = per_layer_norm(grads['blocks'])
    rest = {k: v for k, v in grads.items() if k != 'blocks'}  # the block grads are summed once
    grad_norm = jnp.sqrt(jnp.sum(jnp.square(layer_grad_norm)) + jnp.square(optax.tree.norm(rest)))
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
    new_state = {'step': state['step'] + 1, 'params': keep(params, state['params']),
                 'opt_state': keep(opt_state, state['opt_state']), 'rng': state['rng']}
    layer_grad_norm = per_effective_layer(model.cfg, layer_grad_norm)  # shared: per loop again
    out = {'loss': loss, 'grad_norm': grad_norm, 'ok': ok, 'lr': lr_fn(state['step'], lr),
           'layer_grad_norm': layer_grad_norm}
    if aux:
      stats = update_stats(state['params'], grads, updates)
      out.update(logit_max=aux['logit_max'], param_norm=optax.tree.norm(state['params']),
                 layers={**aux['layers'], 'grad_norm': layer_grad_norm,
                         **{k: per_effective_layer(model.cfg, v) for k, v in stats.items()}})
    return new_state, out

  return step


def update_stats(params, grads, updates) -> dict[str, jax.Array]:
  """Per (unique) block: gradient norms of the attention and MLP sublayers, parameter norm
  ||W|| and update_param_ratio ||delta W|| / ||W|| of the optimizer update (before it is
  applied); the shared blocks' values, LoRA factors not included, under recurrence."""
  param_norm = per_layer_norm(params['blocks'])
  return {'grad_norm_attn': per_layer_norm(grads['blocks']['attn']),
          'grad_norm_mlp': per_layer_norm(grads['blocks']['mlp']),
          'param_norm': param_norm,
          'update_param_ratio': per_layer_norm(updates['blocks']) / jnp.maximum(param_norm, 1e-30)}


def make_eval_step(model: nn.Module, hops: list[int], cfg=None) -> Callable:
  """params, batch[, step] -> sums of weighted loss and, per k-hop value, answer accuracy
  counts; with cfg and step, the model as trained at that step (ProRes alpha, no drops)."""

  def step(params, batch, t=None) -> dict:
    inputs = None if cfg is None or t is None else dynamics.layer_inputs(
        cfg, t, jax.random.PRNGKey(0), batch['inputs'].shape[0], False)
    logits, _ = model.apply({'params': params}, batch['inputs'], inputs, batch.get('segments'))
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
    correct = jnp.argmax(logits, -1) == batch['targets']
    at_hop = [batch['hop'] == k for k in hops]
    return {'loss_sum': jnp.sum(ce * batch['weights']), 'weight_sum': jnp.sum(batch['weights']),
            'correct': jnp.array([jnp.sum(correct & m) for m in at_hop], jnp.float32),
            'count': jnp.array([jnp.sum(m) for m in at_hop], jnp.float32)}

  return step
