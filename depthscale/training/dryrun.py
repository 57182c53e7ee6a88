"""Ahead-of-time check of a ladder: compile every rung's train step for the configured
mesh without training; report parameters, per-device memory, compile time, shardings."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from depthscale.experiment import resolve
from depthscale.model.transformer import make_model, param_counts
from depthscale.training import sharding
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_train_step

GIB = float(1 << 30)


def abstract_batch(cfg, plan: sharding.Plan) -> dict:
  """Shapes of one global training batch (the fields the train step reads; with
  data.document_mask also the segment ids)."""
  shape = (cfg.data.batch_size, cfg.data.seq_len)
  fields = [('inputs', jnp.int32), ('targets', jnp.int32), ('weights', jnp.float32)]
  fields += [('segments', jnp.int32)] if cfg.data.document_mask else []
  return {k: jax.ShapeDtypeStruct(shape, dt, sharding=plan.batch) for k, dt in fields}


def check_rung(cfg) -> tuple[dict[str, Any], list[str]]:
  """Compiles the rung's train step (with per-layer statistics) on abstract arrays."""
  model, tx = make_model(cfg, collect_stats=True), make_optimizer(cfg)
  plan = sharding.make_plan(cfg, model, tx, init_state)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       plan.abstract_state, plan.state)
  t0 = time.perf_counter()
  compiled = plan.compile_train_step(make_train_step(model, tx, schedule(cfg)), state,
                                     abstract_batch(cfg, plan))
  total, non_emb = param_counts(plan.abstract_state['params'])
  mem = compiled.memory_analysis()
  sizes = {k: getattr(mem, f'{k}_size_in_bytes', 0) for k in
           ('argument', 'output', 'temp', 'alias', 'generated_code')} if mem else {}
  peak = (sizes['argument'] + sizes['output'] + sizes['temp'] - sizes['alias']
          + sizes['generated_code']) if sizes else float('nan')
  report = {'params': total, 'non_embedding_params': non_emb, 'mesh': dict(plan.mesh.shape),
            'compile_s': time.perf_counter() - t0, 'bytes_per_device': sizes,
            'peak_bytes_per_device': peak}
  return report, sharding.describe(plan)


def dry_run(config_arg: str, overrides: dict | None = None, rung: str | None = None) -> list[dict]:
  """Checks every selected rung; prints one block per rung and returns the reports."""
  reports = []
  for r, cfg in resolve(config_arg, overrides, rung):
    report, lines = check_rung(cfg)
    b = report['bytes_per_device']
    print(f'rung {r.name}: {report["params"]:,} params ({report["non_embedding_params"]:,} '
          f'non-embedding) on mesh {report["mesh"]} of {jax.device_count()} '
          f'{jax.devices()[0].platform} devices; compiled in {report["compile_s"]:.1f} s', flush=True)
    if b:
      print('  per device: ' + ', '.join(f'{k} {v / GIB:.3f} GiB' for k, v in b.items())
            + f'; predicted peak {report["peak_bytes_per_device"] / GIB:.3f} GiB', flush=True)
    print('\n'.join(lines), flush=True)
    reports.append({'rung': r.name, **report})
  return reports
