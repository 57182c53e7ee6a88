"""Experiment files and their ladders: load, resolve each rung's config, run them all.

Importable from notebooks: `run_ladder('experiments/quickstart.py', 'runs/q')`.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from typing import Any

import depthscale.posthoc  # registers the post-hoc procedures a config can switch on
from depthscale import config as config_lib
from depthscale import program_cache, storage, sweep
from depthscale.config import default_config
from depthscale.ladder import Rung
from depthscale.results.report import rung_row, table
from depthscale.training import dryrun, topology
from depthscale.training.loop import NonFiniteError, train_rung
from depthscale.training.preflight import check_inputs


def small_config():
  """A CPU-size run on the embedded data: d_model 64, 2 heads, T 128, batch 16, 150 steps
  (logs every 25, eval and checkpoint every 75, 15 warmup steps); the quickstart's config."""
  c = default_config()
  c.model.d_model = 64
  c.model.num_heads = 2
  c.data.seq_len = 128
  c.data.batch_size = 16
  c.train.steps = 150
  c.train.log_every = 25
  c.train.eval_every = 75
  c.train.checkpoint_every = 75
  c.optim.warmup_steps = 15
  return c


def transfer_config(parametrization: str, **model):
  """The rate-transfer studies' run (experiments/*_transfer.py) on the synthetic mix: T 64,
  batch 8, 200 steps (logs every 25, eval and checkpoint every 100, 20 warmup steps);
  `model` sets model fields (d_model=64, base_num_layers=2, ...)."""
  c = default_config()
  c.model.parametrization = parametrization
  for field, value in model.items():
    c.model[field] = value
  c.data.seq_len, c.data.batch_size = 64, 8
  c.train.steps, c.train.log_every, c.optim.warmup_steps = 200, 25, 20
  c.train.eval_every = c.train.checkpoint_every = 100
  return c


# Paper sizes train on a real tokenizer's corpus (`python -m depthscale.data.prepare
# --tokenizer=...`, then data.source='array_record:DIR/train-*.array_record').
LLAMA_VOCAB = 32_000  # the SentencePiece models of LLaMA / Llama-2 and T5: 32,000 pieces
GPT2_VOCAB = 50_304  # GPT-2's 50,257 BPE tokens padded to a multiple of 128
LLAMA_BLOCK = {'norm': 'rmsnorm', 'mlp': 'swiglu', 'position': 'rope'}  # LLaMA's block


def study_config(arg: str | None, *, seq_len: int, batch: int, steps: int, log_every: int,
                 analyses: bool = False, **model):
  """default_config() with the recipe every notebook ladder (experiments/repro_*.py) shares:
  the given data shape and length, a 10% warmup, one eval and one checkpoint at the end,
  the periodic analyses only at the end and only if asked, TensorBoard images and an
  unrolled layer scan except in smoke sizes; `model` sets model fields (num_layers=16,
  d_model=64, ...)."""
  c = default_config()
  for field, value in model.items():
    c.model[field] = value
  c.data.seq_len, c.data.batch_size, c.data.eval_batches = seq_len, batch, 2
  c.train.steps, c.train.log_every = steps, log_every
  c.train.eval_every = c.train.checkpoint_every = steps
  c.metrics.analysis_every = steps if analyses else 0
  c.metrics.images = 'smoke' not in (arg or '')
  if 'smoke' in (arg or ''):  # compile-bound sizes: a rolled layer scan compiles faster
    c.model.unroll_max_layers = 0
  c.optim.warmup_steps = steps // 10
  return c


def load_module(path: str):
  """Imports an experiment file by path."""
  if not os.path.isfile(path):
    raise config_lib.ConfigError(f'--config={path!r} is invalid: allowed an existing experiment file')
  spec = importlib.util.spec_from_file_location(
      'experiment_' + os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def split_arg(config_arg: str) -> tuple[str, str | None]:
  """'experiments/x.py:ARG' -> ('experiments/x.py', 'ARG'); no colon -> (path, None)."""
  path, _, arg = config_arg.partition(':')
  return path, (arg if arg else None)


def check_field(cfg, key: str, origin: str) -> None:
  """Raises ConfigError unless the dotted key is a field of cfg, naming the allowed fields
  of the deepest section it reaches (the sections, where it reaches none)."""
  *sections, field = key.split('.')
  section, path = cfg, []
  for part in sections:
    if not isinstance(section.get(part), config_lib.ConfigDict):
      break
    section, path = section[part], path + [part]
  else:
    if field in section and not isinstance(section[field], config_lib.ConfigDict):
      return
  allowed = ', '.join(sorted(section))
  raise config_lib.ConfigError(
      f'{key} ({origin}) is not a config field: allowed ' +
      (f'{".".join(path)}.FIELD with FIELD in {allowed}' if path else
       f'SECTION.FIELD with SECTION in {allowed}'))


def check_flags(config_arg: str, keys: list[str]) -> None:
  """Raises ConfigError for the first command-line field (a --config.KEY flag) that the
  experiment's config does not have (see check_field)."""
  path, arg = split_arg(config_arg)
  cfg = load_module(path).get_config(arg)
  for key in keys:
    check_field(cfg, key, 'command line')


def apply_overrides(cfg, overrides: dict[str, Any], origin: str):
  """Sets dotted fields on a locked ConfigDict; unknown or mistyped fields raise ConfigError."""
  for key, value in overrides.items():
    check_field(cfg, key, origin)
    parts = key.split('.')
    target = cfg
    try:
      for p in parts[:-1]:
        target = target[p]
      target[parts[-1]] = value
    except TypeError as e:
      raise config_lib.ConfigError(f'{key}={value!r} ({origin}) has the wrong type: {e}') from None
  return cfg


def rungs_of(module, arg: str | None) -> list[Rung]:
  """The experiment's rungs, or one rung named 'default' if it declares no ladder."""
  return module.get_ladder(arg) if hasattr(module, 'get_ladder') else [Rung('default')]


LISTED_RUNGS = 12  # a longer ladder's bad --rung error names the closest of its rungs


def select(rungs: list[Rung], rung: str | None) -> list[Rung]:
  """All rungs, or the one named (or 0-based indexed) by `rung`."""
  if rung is None:
    return rungs
  names = [r.name for r in rungs]
  if rung in names:
    return [rungs[names.index(rung)]]
  if rung.isdigit() and int(rung) < len(rungs):
    return [rungs[int(rung)]]
  shown = (', '.join(names) if len(names) <= LISTED_RUNGS else
           f'{len(names)} names, closest: ' + ', '.join(
               difflib.get_close_matches(rung, names, LISTED_RUNGS // 2, 0) or names[:LISTED_RUNGS // 2]))
  raise config_lib.ConfigError(f'--rung={rung!r} is invalid: allowed 0..{len(rungs) - 1} '
                               f'or one of {shown}')


def resolve(config_arg: str, overrides: dict[str, Any] | None = None,
            rung: str | None = None, check_machine: bool = True) -> list[tuple[Rung, Any]]:
  """(rung, validated config) pairs: get_config(arg), then the rung's overrides, then
  `overrides` (the command line's) last; with check_machine the data sources and the mesh
  against this machine too (a dry run checks against its target instead). Raises
  ConfigError before anything is written."""
  path, arg = split_arg(config_arg)
  module = load_module(path)
  out = []
  for r in select(rungs_of(module, arg), rung):
    cfg = module.get_config(arg)
    cfg.lock()
    apply_overrides(cfg, r.overrides, f'rung {r.name}')
    apply_overrides(cfg, overrides or {}, 'command line')
    config_lib.validate(cfg)
    if check_machine:
      check_inputs(cfg)
    out.append((r, cfg))
  return out


def dry_run(config_arg: str, overrides: dict[str, Any] | None = None, rung: str | None = None,
            topology_name: str | None = None, num_slices: int = 1,
            json_path: str | None = None, shardings: bool = True,
            scale_cost: bool = True, num_nodes: int = 1, resume: bool = False,
            smallest: bool = False) -> list[dict]:
  """The dry run of the selected rungs (depthscale.training.dryrun.check_ladder), for a TPU
  slice or num_nodes GPU nodes if topology_name is given: configs checked against that
  target, not this machine. smallest: each rung's smallest fitting slice too (TPU)."""
  slice_ = topology.parse(topology_name, num_slices, num_nodes) if topology_name else None
  if smallest and (slice_ is None or slice_.platform != 'tpu'):
    raise config_lib.ConfigError(f'--smallest_slice needs a TPU --topology (given: '
                                 f'{topology_name!r})')
  resolved = resolve(config_arg, dryrun.target_overrides(slice_, overrides), rung,
                     check_machine=False)
  return dryrun.check_ladder(resolved, config_arg, overrides, slice_, json_path, shardings,
                             scale_cost, resume, smallest)


def stage1_rungs(config_arg: str) -> set[str]:
  """The names of the ladder's learning-rate sweep rungs that a stage 2 chooses among."""
  path, arg = split_arg(config_arg)
  return {n for r in rungs_of(load_module(path), arg) for n in r.best_lr_of}


def prepare(config_arg: str, workdir: str, overrides: dict[str, Any] | None = None,
            rung: str | None = None, check_machine: bool = True) -> list[tuple[Rung, Any]]:
  """resolve() and the ladder's own checks: a sweep's rate is not set on the command line,
  and a selected rung's needs are selected too or finished in workdir. Prints each rung's
  info. Raises ConfigError before anything is written."""
  resolved = resolve(config_arg, overrides, rung, check_machine)
  stage1 = stage1_rungs(config_arg)
  if stage1 and 'optim.lr' in (overrides or {}):
    raise config_lib.ConfigError('optim.lr (command line) cannot be set: this ladder sweeps it')
  selected = {r.name for r, _ in resolved}
  for r, cfg in resolved:
    missing = [n for n in sweep.unfinished(workdir, r.needs) if n not in selected]
    if missing:
      raise config_lib.ConfigError(f'--rung={r.name} needs its finished learning-rate sweep: '
                                   f'{", ".join(missing)} not finished in {workdir}')
    if r.info:
      print(f'rung {r.name}: ' + ', '.join(f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
                                           for k, v in r.info.items()), flush=True)
  return resolved


def run_ladder(config_arg: str, workdir: str, overrides: dict[str, Any] | None = None,
               rung: str | None = None, allow_config_change: bool = False,
               compilation_cache: bool = True) -> list[dict]:
  """Trains every selected rung in workdir/<rung name>/ (resuming or skipping finished
  ones) and returns the table rows; prints the comparison table at the end.
  allow_config_change: resume rungs whose config changed in fields that change the
  computed function or the data order (see depthscale.training.resume).
  In a learning-rate sweep (ladder.lr_sweep) a diverged stage-1 rung is recorded and the
  ladder goes on; an extension rung trains past the edge of the rates before it or, not
  needed, trains nothing; a stage-2 rung trains at the best stage-1 rate (depthscale.sweep).
  compilation_cache: the rungs share compiled programs (depthscale.program_cache)."""
  resolved = prepare(config_arg, workdir, overrides, rung)
  if compilation_cache:
    program_cache.share(workdir)
  stage1 = stage1_rungs(config_arg)
  rows = []
  for r, cfg in resolved:
    rung_dir = storage.join(workdir, r.name)
    if r.best_lr_of:
      cfg.optim.lr = sweep.choose(workdir, r.name, r.best_lr_of, r.lr_rank)
      print(f'rung {r.name}: rate {r.lr_rank} of the sweep lr={cfg.optim.lr:g}', flush=True)
    if r.extension:
      lr = sweep.extend(workdir, r.name, r.extension)
      if lr is None:
        print(f'rung {r.name}: not needed, the best rate of its sweep is inside it', flush=True)
        continue
      cfg.optim.lr = lr
      print(f'rung {r.name}: past the edge of its sweep lr={lr:g}', flush=True)
    if r.name in stage1 and sweep.final_loss(rung_dir) == float('inf'):
      continue  # diverged before: the worst rate of its sweep
    try:
      summary = train_rung(cfg, rung_dir, name=r.name, allow_config_change=allow_config_change)
    except NonFiniteError as e:
      if r.name not in stage1:
        raise
      sweep.record_divergence(rung_dir, str(e))
      print(f'rung {r.name}: diverged, the worst rate of its sweep ({e})', flush=True)
      continue
    if 'status' in summary:  # preempted: stop the ladder here
      return rows
    rows.append(rung_row(r.name, cfg, summary))
  print(table(rows), flush=True)
  return rows
