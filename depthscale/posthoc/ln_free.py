"""Removing the norms by fine-tuning (Heimersheim 2024, arXiv 2409.13710).

With posthoc.remove_norms_every = k > 0 every LayerNorm / RMSNorm of the model holds a
frozen divisor c (a parameter without gradient, 0 while the norm is live;
depthscale.model.norms). Norm i of the removal order is removed before the update of step
posthoc.remove_norms_start + i k: c is set to the mean over the step's batch and positions
of its input's sqrt(var + eps) (RMSNorm: sqrt(mean(x^2) + eps)), and from then on the norm
computes g (x - mean(x)) / c + b (RMSNorm g x / c): a fixed linear map. The order follows
the paper's GPT-2 schedule: the MLP-input norms of blocks 1..L, then the other block norms
(attention input) of blocks 1..L, then the norms outside the blocks (the final norm). The
model that ends the run has no normalization left.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from depthscale.errors import invalid
from depthscale.model.param_tree import path_keys
from depthscale.model.transformer import Transformer, make_model
from depthscale.training import procedures
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state

Norm = tuple[tuple[str, ...], int | None]  # (key path of its divisor, 0-based layer or None)


def removal_order(params) -> list[Norm]:
  """Every frozen-divisor norm of the parameters, in the order they are removed."""
  paths = []
  jax.tree_util.tree_map_with_path(
      lambda p, leaf: paths.append((path_keys(p), leaf.shape)) if path_keys(p)[-1] == 'divisor'
      else None, params)
  blocks = sorted((p for p, _ in paths if p[0] == 'blocks'), key=lambda p: ('mlp' not in p[1], p))
  layers = dict(paths)[blocks[0]][0] if blocks else 0
  return ([(p, l) for p in blocks for l in range(layers)]
          + [(p, None) for p, _ in sorted(paths) if p[0] != 'blocks'])


def schedule(cfg, params) -> dict[int, Norm]:
  """Step -> the norm removed before that step's update."""
  p = cfg.posthoc
  return {p.remove_norms_start + i * p.remove_norms_every: norm
          for i, norm in enumerate(removal_order(params))}


def check(cfg) -> None:
  """Raises ConfigError unless the last norm is removed before train.steps."""
  p = cfg.posthoc
  if not p.remove_norms_every:
    return
  model = make_model(cfg)
  shapes = jax.eval_shape(lambda: init_state(model, make_optimizer(cfg), 0, cfg.data.seq_len))
  last = max(schedule(cfg, shapes['params']))
  if last >= cfg.train.steps:
    n = len(removal_order(shapes['params']))
    raise invalid('posthoc.remove_norms_every', p.remove_norms_every,
                  f'a value that removes the last of the {n} norms (step posthoc.remove_norms_start'
                  f' + {n - 1} x every) before train.steps={cfg.train.steps}, not at step {last}')


def _at(tree, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


def input_stds(model: Transformer, params, batch: dict):
  """The sown 'input_std' of every frozen-divisor norm ([L] under the blocks, else scalar),
  in the tree of 'intermediates'."""
  _, sown = model.apply({'params': params}, batch['inputs'], None, batch.get('segments'),
                        mutable=['intermediates'])
  return sown['intermediates']


def freeze(params, norm: Norm, c) -> dict:
  """params with the norm's divisor set to c (its sharding kept)."""
  path, layer = norm

  def update(p, leaf):
    if path_keys(p) != path:
      return leaf
    new = jnp.full_like(leaf, c) if layer is None else leaf.at[layer].set(c)
    return jax.device_put(new, leaf.sharding)
  return jax.tree_util.tree_map_with_path(update, params)


def removed(params) -> int:
  """How many norms are removed (their divisor set)."""
  paths = {path for path, _ in removal_order(params)}
  return sum(int(np.sum(np.asarray(_at(params, path)) > 0)) for path in paths)


class Remover:
  """Applies the removal schedule to a train state before each step's update."""

  def __init__(self, cfg, model: Transformer, params):
    self.at = schedule(cfg, params)
    self.stds = jax.jit(lambda p, b: input_stds(model, p, b))

  def __call__(self, state: dict, step: int, batch: dict) -> dict:
    norm = self.at.get(step)
    if norm is None:
      return state
    path, layer = norm
    std = _at(self.stds(state['params'], batch), path[:-1] + ('input_std',))[0]
    c = std if layer is None else std[layer]
    return {**state, 'params': freeze(state['params'], norm, c)}


procedures.register(procedures.Procedure(
    'ln_free', switch='remove_norms_every', fields=('remove_norms_every', 'remove_norms_start'),
    check=lambda cfg, workdir: check(cfg), transform=Remover,
    summary=lambda params: {'norms_removed': removed(params)}))
