"""Subprocess side of tests/test_sharding.py; the parent sets XLA_FLAGS to fake CPU devices.

  python -m tests.sharding_worker cases WORKDIR          all single-process mesh cases
  python -m tests.sharding_worker reference WORKDIR      the default-metrics rung on one device
  python -m tests.sharding_worker process WORKDIR ADDR N I [SIGTERM_AT]   one of N
      jax.distributed processes training the default-metrics rung (this one sends itself
      SIGTERM as it draws batch SIGTERM_AT)
Prints one JSON line (prefixed RESULT) for the parent to check.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import jax

from depthscale import data, storage
from depthscale.config import ConfigError, default_config, validate
from depthscale.model.transformer import make_model
from depthscale.training import distributed, dryrun, sharding
from depthscale.training.loop import train_rung
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step
from depthscale.storage import read_jsonl
from tests.helpers import tiny_config

MESHES = ((8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 4, 2))
METRICS_MESHES = ((2, 4, 1), (2, 2, 2))
WATCHDOG_SECONDS = 240.0  # a hang fails the worker well before XLA's collective timeout


def config(mesh: tuple[int, int, int], **overrides):
  """10 steps of the tiny model, batch 8, per-layer metrics every step."""
  return tiny_config(**{'data.batch_size': 8, 'train.steps': 10, 'train.log_every': 1,
                        'train.eval_every': 10, 'train.checkpoint_every': 5,
                        'mesh.data': mesh[0], 'mesh.fsdp': mesh[1], 'mesh.tensor': mesh[2],
                        **overrides})


def metrics_config(mesh: tuple[int, int, int]):
  """The default metrics settings (analyses, images, analysis batch) on 8 steps: plain and
  statistics steps (log_every 3), analyses every 3 steps, evals and checkpoints every 4."""
  m = default_config().metrics
  return config(mesh, **{'train.steps': 8, 'train.log_every': 3, 'train.eval_every': 4,
                         'train.checkpoint_every': 4, 'data.eval_batches': 2,
                         'metrics.analysis_every': 3, 'metrics.images': m.images,
                         'metrics.analysis_batch_size': m.analysis_batch_size,
                         'train.watchdog_seconds': WATCHDOG_SECONDS})


def all_logs(workdir: str) -> dict[str, list[dict]]:
  """Every JSONL log of a rung, timings left out."""
  return {name: [{k: v for k, v in r.items() if not k.startswith('perf/')}
                 for r in read_jsonl(storage.join(workdir, f'{name}.jsonl'))]
          for name in ('train_log', 'eval_log', 'analysis_log', 'layer_metrics')}


def reference(cfg) -> dict:
  """Losses and per-layer metrics of the unsharded step on one device (no plan, no mesh)."""
  model, tx = make_model(cfg, collect_stats=True), make_optimizer(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, cfg.train.seed, cfg.data.seq_len)
  step = jax.jit(make_train_step(model, tx, schedule(cfg)))
  it = data.train_iterator(cfg.data, cfg.train.seed)
  losses, layers = [], []
  for _ in range(cfg.train.steps):
    state, out = step(state, next(it))
    losses.append(float(out['loss']))
    layers.append({k: [float(x) for x in v] for k, v in jax.device_get(out['layers']).items()})
  return {'loss': losses, 'layers': layers}


def sharded(cfg) -> dict:
  """The same steps under the config's mesh: planned state, global batches, AOT compile."""
  model, tx = make_model(cfg, collect_stats=True), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = plan.init(init_state, model, tx, cfg.train.seed, cfg.data.seq_len)
  it = data.train_iterator(cfg.data, cfg.train.seed)
  batch = plan.global_batch(next(it))
  step = plan.compile_train_step(make_train_step(model, tx, schedule(cfg)), state, batch)
  lr = plan.scalar(cfg.optim.lr)
  losses, layers = [], []
  for s in range(cfg.train.steps):
    state, out = step(state, batch if s == 0 else plan.global_batch(next(it)), lr)
    losses.append(float(out['loss']))
    layers.append({k: [float(x) for x in v] for k, v in jax.device_get(out['layers']).items()})
  return {'loss': losses, 'layers': layers}


def logged(workdir: str) -> dict:
  """Losses and per-layer metrics a rung wrote."""
  layers = read_jsonl(os.path.join(workdir, 'layer_metrics.jsonl'))
  return {'loss': [r['train/loss'] for r in read_jsonl(os.path.join(workdir, 'train_log.jsonl'))],
          'layers': [{k: v for k, v in r.items() if k != 'step'} for r in layers]}


def placements(tree) -> dict[str, list]:
  """path -> [mesh partition, shape of the first addressable shard] per array leaf."""
  return {jax.tree_util.keystr(p): [[list(a) if isinstance(a, tuple) else a for a in x.sharding.spec],
                                    list(x.addressable_shards[0].data.shape)]
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0] if x.ndim}


def error_of(fn) -> str:
  try:
    fn()
  except ConfigError as e:
    return str(e)
  return ''


def run_cases(workdir: str) -> dict:
  result = {'devices': jax.device_count(), 'reference': reference(config((1, 1, 1)))}
  for mesh in MESHES:
    result['x'.join(map(str, mesh))] = sharded(config(mesh))

  resumed = os.path.join(workdir, 'resumed')
  result['stopped'] = train_rung(config((2, 4, 1)), resumed, stop_at_step=5)
  train_rung(config((8, 1, 1)), resumed)
  result['resumed'] = logged(resumed)

  cfg = config((1, 4, 2))
  model, tx = make_model(cfg), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = plan.init(init_state, model, tx, cfg.train.seed, cfg.data.seq_len)
  result['params'] = placements(state['params'])
  result['opt_state'] = placements(state['opt_state'])

  bad = config((1, 4, 2), **{'mesh.max_replicated_size': 1000})
  for name in ('embed', 'mlp', 'heads', 'vocab'):
    bad.mesh.rules[name] = ''
  result['replicated_error'] = error_of(lambda: sharding.make_plan(bad, model, tx, init_state))
  report, lines = dryrun.check_rung(config((1, 4, 2)))
  result['dry_run'] = {**report, 'lines': lines}
  layers_sharded = config((1, 4, 2))
  layers_sharded.mesh.rules.layers = 'fsdp'
  result['layers_error'] = error_of(lambda: validate(layers_sharded))
  for mesh in METRICS_MESHES:
    name = 'x'.join(map(str, mesh))
    summary = train_rung(metrics_config(mesh), os.path.join(workdir, 'metrics_' + name))
    result['metrics_' + name] = {'summary': summary,
                                 'logs': all_logs(os.path.join(workdir, 'metrics_' + name))}
  return result


def run_reference(workdir: str) -> dict:
  summary = train_rung(metrics_config((1, 1, 1)), workdir)
  return {'devices': jax.device_count(), 'summary': summary, 'logs': all_logs(workdir)}


class _SigtermAt:
  """A train iterator that sends this process SIGTERM as it draws batch `at` (0-based)."""

  def __init__(self, it, at: int):
    self.it, self.at, self.drawn = it, at, 0

  def __next__(self):
    if self.drawn == self.at:
      os.kill(os.getpid(), signal.SIGTERM)
    self.drawn += 1
    return next(self.it)

  def get_state(self):
    return self.it.get_state()

  def set_state(self, state) -> None:
    self.it.set_state(state)


def run_process(workdir: str, address: str, count: int, index: int,
                sigterm_at: int | None) -> dict:
  """The default-metrics rung with fsdp across processes (mesh data 1, fsdp 4)."""
  distributed.initialize(address, count, index)
  if sigterm_at is not None:
    make = data.train_iterator
    data.train_iterator = lambda *a, **k: _SigtermAt(make(*a, **k), sigterm_at)
  summary = train_rung(metrics_config((1, 4, 1)), workdir)
  return {'process_index': jax.process_index(), 'process_count': jax.process_count(),
          'devices': jax.device_count(), 'summary': summary,
          'logs': all_logs(workdir) if jax.process_index() == 0 else None}


if __name__ == '__main__':
  mode, out_dir = sys.argv[1], sys.argv[2]
  if mode == 'cases':
    res = run_cases(out_dir)
  elif mode == 'reference':
    res = run_reference(out_dir)
  else:
    res = run_process(out_dir, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                      int(sys.argv[6]) if len(sys.argv) > 6 else None)
  print('RESULT ' + json.dumps(res), flush=True)
