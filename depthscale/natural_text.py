"""`<size>-text` experiment args: a repro ladder at one of its sizes trained on the built-in
`python_docs` corpus (English prose that ships with Python, byte tokens) instead of the
synthetic mix, with an eval at every quarter of the steps, so that the ranking of the
variants at 50% and at 100% of the steps can be read (`Results.ranking`).

An experiment file offers them by declaring, below its get_config and get_ladder,
  TEXT = natural_text.TextSizes({size: variants, ...})
  get_config, get_ladder = TEXT.offer(get_config, get_ladder)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import linen as nn

from depthscale.errors import ConfigError
from depthscale.ladder import SEED, split_seed
from depthscale.model.transformer import make_model, param_counts

SUFFIX = '-text'
CORPUS = 'python_docs'
EVALS = 4  # evals per run, evenly spaced: at 25%, 50%, 75% and 100% of the steps


@dataclasses.dataclass(frozen=True)
class TextSizes:
  """The sizes an experiment offers on natural text, each with the variants trained there
  (rung names less their seed part: 'pre_ln' for 'pre_ln_s0' and every shape of
  'pre_ln_s0_<shape>', or 'pre_ln_<shape>' for one shape), seeds s0 .. s<seeds-1>."""
  variants: dict[str, tuple[str, ...]]
  seeds: int = 1

  def split(self, arg: str | None) -> tuple[str | None, bool]:
    """(the size arg, whether `arg` asks for natural text); a text size not offered raises
    ConfigError."""
    if not (arg or '').endswith(SUFFIX):
      return arg, False
    size = arg.removesuffix(SUFFIX)
    if size not in self.variants:
      raise ConfigError(f'--config arg {arg!r} is invalid: allowed natural-text sizes '
                        + ', '.join(s + SUFFIX for s in self.variants))
    return size, True

  def offer(self, get_config, get_ladder):
    """An experiment's (get_config, get_ladder) that also take '<size>-text': <size>'s
    config on python_docs with EVALS evals, and <size>'s rungs of the offered variants and
    seeds."""

    @functools.wraps(get_config)
    def config(arg: str | None = None):
      size, text = self.split(arg)
      cfg = get_config(size)
      if text:
        cfg.data.source = CORPUS
        cfg.train.eval_every = max(1, cfg.train.steps // EVALS)
      return cfg

    @functools.wraps(get_ladder)
    def ladder(arg: str | None = None):
      size, text = self.split(arg)
      rungs = get_ladder(size)
      return [r for r in rungs if self._trains(r.name, size)] if text else rungs

    return config, ladder

  def _trains(self, rung: str, size: str) -> bool:
    variant, seed = split_seed(rung)
    names = self.variants[size]
    shaped = SEED.sub('', rung, count=1)  # 'pre_ln_s0_d64_L8' -> 'pre_ln_d64_L8'
    return (variant in names or shaped in names) and seed is not None and seed < self.seeds


def tokens_per_param(cfg) -> float:
  """Training tokens (steps x batch x seq_len) per non-embedding parameter of cfg's model,
  from abstract shapes (nothing initialized)."""
  toks = jax.ShapeDtypeStruct((1, cfg.data.seq_len), jnp.int32)
  params = nn.unbox(jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), toks))['params']
  return cfg.train.steps * cfg.data.batch_size * cfg.data.seq_len / param_counts(params)[1]
