"""Subprocess side of tests/test_train.py::test_user_xla_flags_compute_what_the_suite_flags_do:
a user's process (no JAX_* variables, XLA_FLAGS only faking 2 host devices) runs the programs
of a rung once: the plain step unrolled and rolled, the statistics step, eval, and the
statistics step with eval again sharded over the 2 devices.

  python -m tests.compile_options_worker
Prints one JSON line (prefixed RESULT) for the parent to check against its own programs.
"""

from __future__ import annotations

import json

import jax
import numpy as np

from depthscale import data
from depthscale.model import ops
from depthscale.model.transformer import make_model, scan_unroll
from depthscale.training import sharding
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_eval_step, make_train_step
from tests.helpers import tiny_config


def probe_config(**overrides):
  """tiny_config without warmup: the first step's learning rate is the peak, so the step's
  parameters differ from the initial ones by a full optimizer update."""
  return tiny_config(**{'optim.warmup_steps': 0, **overrides})


UNROLLED = probe_config()  # 3 layers <= 16: the plain step's layer scan is unrolled on CPU
ROLLED = probe_config(**{'model.unroll_max_layers': 0})  # rolled everywhere
SHARDED = probe_config(**{'mesh.data': 1, 'mesh.fsdp': 2})  # batch and parameters split in 2


def _floats(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64).tolist(), jax.device_get(tree))


def programs(cfg, devices, plain: bool = True, stats: bool = True) -> dict:
  """What the rung's programs (compiled as the loop compiles them: plan, AOT, compiler
  options) return on the first batch from the initial state: the plain step's loss and
  gradient norm (if plain), and (if stats) the statistics step's outputs (loss, global and per-layer
  statistics), the parameter update it applied, and the eval sums on the eval batches."""
  model, stats_model = make_model(cfg), make_model(cfg, collect_stats=True)
  tx, lr_fn = make_optimizer(cfg), schedule(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state, devices)
  fresh = lambda: plan.init(init_state, model, tx, cfg.train.seed, cfg.data.seq_len)
  batch = plan.global_batch(next(data.train_iterator(cfg.data, cfg.train.seed)))
  result = {}
  if plain:
    state = fresh()
    step = plan.compile_train_step(make_train_step(model, tx, lr_fn, cfg), state, batch)
    out = step(state, batch, plan.scalar(cfg.optim.lr))[1]
    result['plain'] = {'loss': float(out['loss']), 'grad_norm': float(out['grad_norm'])}
  if not stats:
    return result

  state = fresh()
  before = jax.device_get(state['params'])  # the step donates the state
  step = plan.compile_train_step(make_train_step(stats_model, tx, lr_fn, cfg), state, batch)
  state, out = step(state, batch, plan.scalar(cfg.optim.lr))
  result['stats'] = _floats({k: out[k] for k in ('loss', 'grad_norm', 'param_norm',
                                                  'logit_max', 'lr', 'layers')})
  result['update'] = _floats(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b,
                                          jax.device_get(state['params']), before))

  hops = data.hop_values(cfg.data)
  eval_set = [plan.global_batch(b) for b in data.eval_batches(cfg.data, cfg.train.seed,
                                                              cfg.data.eval_batches)]
  params = fresh()['params']
  p = plan
  eval_fn = p.compile(make_eval_step(model, hops, cfg), (p.state['params'], p.batch, p.replicated),
                      p.replicated, params, eval_set[0], state['step'])
  result['eval'] = [_floats(eval_fn(params, b, state['step'])) for b in eval_set]
  return result


def main() -> None:
  devices = jax.devices()
  # a user's process: no compilation cache, so one-device CPU steps get the oneDNN options
  assert not jax.config.jax_compilation_cache_dir and len(devices) == 2
  assert ops.compiler_options('cpu') in (None, ops.CPU_COMPILER_OPTIONS)
  assert scan_unroll(make_model(UNROLLED).cfg, False) == UNROLLED.model.num_layers
  assert scan_unroll(make_model(ROLLED).cfg, False) == 1
  result = {'unrolled': programs(UNROLLED, devices[:1]),
            'rolled': programs(ROLLED, devices[:1], stats=False)['plain'],
            'sharded': programs(SHARDED, devices, plain=False)}
  print('RESULT ' + json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
