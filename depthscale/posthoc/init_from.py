"""A run that starts from a finished rung or a Hugging Face checkpoint directory
(posthoc.init_from; depthscale.hf reads GPT-2, Llama, Mistral and Qwen2): the source's
directory, config and final parameters, the checks of the new config against it, and the start
parameters (pruned when posthoc.prune_layers is set) with what they lost."""

from __future__ import annotations

import jax
import numpy as np

from depthscale import data, hf, storage
from depthscale.config import ConfigDict, default_config, flatten
from depthscale.errors import ConfigError, invalid
from depthscale.model.transformer import make_model
from depthscale.posthoc import prune, streams
from depthscale.training import procedures
from depthscale.training.checkpoint import Checkpointer
from depthscale.training.optim import make_optimizer
from depthscale.training.steps import init_state

# model fields that change how the function is computed, not which function
FREE_MODEL_FIELDS = ('remat', 'unroll_max_layers', 'attention_kernel', 'dtype')


def rung_dir(init_from: str, workdir: str) -> str:
  """init_from as a directory: a bare name is a rung of the same ladder as workdir; a path
  or bucket URL is taken as it is."""
  if storage.is_url(init_from) or '/' in init_from:
    return init_from
  return storage.join(storage.parent(storage.absolute(workdir)), init_from)


def read_config(rung: str, field: str = 'posthoc.init_from', finished: bool = True) -> ConfigDict:
  """The finished rung's config: its config.json over the defaults (fields the code no
  longer has are left out); `field` names the input in the error of an unfinished rung
  (finished=False: of a rung without config.json)."""
  path = storage.join(rung, 'config.json')
  if not (finished or storage.exists(path)):
    raise ConfigError(f'{field}={rung!r} is invalid: allowed the directory of a rung, holding '
                      'config.json and checkpoints')
  if finished and not (storage.exists(path) and storage.exists(storage.join(rung, 'summary.json'))):
    raise ConfigError(f'{field}={rung!r} is invalid: allowed the directory of a finished rung, '
                      'holding config.json and summary.json (or, for posthoc.init_from, the '
                      'name of a rung of the same ladder)')
  c = default_config()
  known = flatten(c.to_dict())
  c.update_from_flattened_dict({k: v for k, v in flatten(storage.read_json(path)).items()
                                if k in known})
  return c


def source_config(rung: str, seq_len: int) -> ConfigDict:
  """The config of a finished rung, or of a Hugging Face checkpoint run at seq_len."""
  if not hf.is_checkpoint(rung):
    return read_config(rung)
  hf.check_weights(rung)
  return hf.read_config(rung, seq_len)


def check(cfg, workdir: str) -> ConfigDict | None:
  """The source rung's config (None without posthoc.init_from); raises ConfigError if it is
  not finished or if cfg's model differs from it in more than the procedure changes."""
  if not cfg.posthoc.init_from:
    return None
  src = source_config(rung_dir(cfg.posthoc.init_from, workdir), cfg.data.seq_len)
  for field, value in cfg.model.items():
    if field not in FREE_MODEL_FIELDS + ('num_layers',) and src.model[field] != value:
      raise invalid(f'model.{field}', value, f'{src.model[field]!r}, the value in the '
                    'posthoc.init_from rung')
  if cfg.model.position == 'learned' and cfg.data.seq_len != src.data.seq_len:
    raise invalid('data.seq_len', cfg.data.seq_len, f'{src.data.seq_len} (the init_from rung '
                  "learned its position embeddings for it)")
  if cfg.posthoc.prune_layers or cfg.model.num_layers != src.model.num_layers:
    prune.check_prunable(src, cfg)
  if jax.process_count() > 1:
    raise invalid('posthoc.init_from', cfg.posthoc.init_from, "'' on more than one process")
  return src


def restore_params(src_cfg, rung: str, sharding):
  """The final parameters of the rung (its latest checkpoint) or of the Hugging Face
  checkpoint, placed with `sharding`."""
  if hf.is_checkpoint(rung):
    return hf.load(rung, sharding, src_cfg.data.seq_len)[1]
  model, tx = make_model(src_cfg), make_optimizer(src_cfg)
  shapes = jax.eval_shape(lambda: init_state(model, tx, 0, src_cfg.data.seq_len))
  abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                          shapes)
  ckpt = Checkpointer(storage.join(rung, 'checkpoints'), 1)
  try:
    state, _ = ckpt.restore(ckpt.latest_step(), abstract)
  finally:
    ckpt.close()
  return state['params']


def overlay(fresh, source, init_from: str, path: str = 'params'):
  """fresh with every leaf the source also has taken from the source (the run's own new
  parameters, such as frozen norm divisors, stay fresh); raises ConfigError on a source
  leaf the run lacks or of another shape."""
  def fail(what: str):
    raise ConfigError(f'posthoc.init_from={init_from!r} is invalid: allowed a rung whose '
                      f'parameters fit this run ({path}: {what})')
  if not isinstance(fresh, dict):
    if fresh.shape != source.shape:
      fail(f'shape {source.shape}, this run {fresh.shape}')
    return source
  if set(source) - set(fresh):
    fail(f'{sorted(set(source) - set(fresh))} that this run lacks')
  return {k: overlay(v, source[k], init_from, f'{path}/{k}') if k in source else v
          for k, v in fresh.items()}


def start(cfg, src_cfg, workdir: str, sharding, fresh) -> tuple[dict, dict]:
  """(start parameters, info): the source rung's final parameters with the
  posthoc.prune_layers blocks of least angular distance dropped, over the fresh parameters
  `fresh` (see overlay), and the summary fields posthoc_source_eval_loss and
  posthoc_start_eval_loss (means over this run's eval batches, before any fine-tuning) and,
  when pruning, prune_first_block (1-based), prune_fraction, prune_distance and
  prune_distances (d(l, n) for every start l)."""
  rung = rung_dir(cfg.posthoc.init_from, workdir)
  src_model, model = make_model(src_cfg), make_model(cfg)
  params = restore_params(src_cfg, rung, sharding)
  batches = data.eval_batches(cfg.data, cfg.train.seed, cfg.data.eval_batches)

  def mean_loss(p, m) -> float:
    fn = jax.jit(lambda p, b: streams.loss(m, p, b))
    return float(np.mean([fn(p, b) for b in batches]))

  info = {'posthoc_source_eval_loss': mean_loss(params, src_model)}
  n = cfg.posthoc.prune_layers
  if n:
    dist = jax.jit(lambda p, b: prune.block_distances(streams.residual_streams(src_model, p, b), n))
    d = np.mean([np.asarray(dist(params, b), np.float64) for b in batches], axis=0)
    first = int(np.argmin(d))
    params = prune.drop_blocks(params, first, n)
    info.update(prune_first_block=first + 1, prune_fraction=n / src_cfg.model.num_layers,
                prune_distance=float(d[first]), prune_distances=[float(v) for v in d])
  params = overlay(jax.device_get(fresh), params, cfg.posthoc.init_from)
  info['posthoc_start_eval_loss'] = mean_loss(params, model)
  return params, info


def describe(cfg, info: dict) -> str:
  """One line on the start: what was dropped, the eval loss before fine-tuning."""
  line = f'starts from {cfg.posthoc.init_from}'
  n = cfg.posthoc.prune_layers
  if n:
    first = info['prune_first_block']
    line += (f': blocks {first}-{first + n - 1} of {cfg.model.num_layers + n} dropped (angular '
             f'distance {info["prune_distance"]:.4f})')
  return line + (f'; eval loss {info["posthoc_source_eval_loss"]:.4f} -> '
                 f'{info["posthoc_start_eval_loss"]:.4f} before fine-tuning')


def _start_hook(cfg, src_cfg, workdir: str, sharding, fresh) -> procedures.Start:
  params, info = start(cfg, src_cfg, workdir, sharding, fresh)
  return procedures.Start(params, info, describe(cfg, info))


procedures.register(procedures.Procedure(
    'init_from', switch='init_from', fields=('init_from', 'prune_layers'), check=check,
    start=_start_hook))
