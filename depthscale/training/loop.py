"""The training loop of one rung: data, compiled steps, logs, eval, checkpoints, resume."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import jax
import numpy as np

from depthscale import data
from depthscale.model import ops
from depthscale.model.transformer import make_model, param_counts
from depthscale.results import plots
from depthscale.training import host_memory, sharding
from depthscale.training.analysis import Analyzer
from depthscale.training.checkpoint import Checkpointer, abstract
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.steps import init_state, make_eval_step, make_train_step
from depthscale.training.writers import Jsonl, TensorBoard, read_jsonl


class NonFiniteError(RuntimeError):
  """Loss or gradients became non-finite; the last good checkpoint is kept."""


class _Preemption:
  """Turns SIGTERM into a flag the loop checks between steps."""

  def __init__(self):
    self.requested = False

  def __enter__(self):
    self._main = threading.current_thread() is threading.main_thread()
    if self._main:  # signal handlers can only be set from the main thread
      self._old = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, *_):
    self.requested = True

  def __exit__(self, *_):
    if self._main:
      signal.signal(signal.SIGTERM, self._old)


def _eta(seconds: float) -> str:
  s = int(max(seconds, 0))
  return f'{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}'


def tb_layer_subset(num_layers: int, max_layers: int) -> list[int]:
  """0-based layers with per-layer TensorBoard scalars: all, or max_layers evenly spaced
  ones (first and last included) for deeper models."""
  if num_layers <= max_layers:
    return list(range(num_layers))
  return sorted({int(round(v)) for v in np.linspace(0, num_layers - 1, max_layers)})


class _Logs:
  """Process-0 outputs of a rung: TensorBoard, layer_metrics.jsonl, train/eval/analysis logs."""

  def __init__(self, workdir: str, resume_step: int | None, tb_layers: list[int]):
    self.tb = TensorBoard(workdir)
    self.tb_layers = tb_layers
    self.pending_analysis: tuple[int, dict] | None = None  # merged into that step's record
    self.layers = Jsonl(os.path.join(workdir, 'layer_metrics.jsonl'), resume_step)
    self.train = Jsonl(os.path.join(workdir, 'train_log.jsonl'), resume_step)
    self.analysis = Jsonl(os.path.join(workdir, 'analysis_log.jsonl'), resume_step)
    # an eval at the restored step was written before its checkpoint: keep it
    self.eval = Jsonl(os.path.join(workdir, 'eval_log.jsonl'),
                      None if resume_step is None else resume_step + 1)

  def log_train(self, step: int, scalars: dict, layers: dict | None) -> None:
    self.train.write({'step': step, **scalars})
    self.tb.scalars(step, scalars)
    if layers:
      self._layer_record(step, layers)

  def _layer_record(self, step: int, layers: dict) -> None:
    """One layer_metrics.jsonl record per step: the step's analyses, if any, merged in."""
    if self.pending_analysis and self.pending_analysis[0] == step:
      layers = {**layers, **self.pending_analysis[1]}
      self.pending_analysis = None
    if self.pending_analysis and self.pending_analysis[0] < step:
      self.flush_analysis()  # an analysis at a step without a logging record: its own record
    self.layers.write({'step': step, **{k: [float(v) for v in vs] for k, vs in layers.items()}})
    self.tb.scalars(step, {f'layers/{k}/{l + 1:04d}': vs[l]
                           for k, vs in layers.items() for l in self.tb_layers})

  def log_analysis(self, step: int, layers: dict, scalars: dict) -> None:
    """Analyses of the parameters at `step`, held until that step's logging record."""
    self.flush_analysis()
    self.pending_analysis = (step, layers)
    self.analysis.write({'step': step, **scalars})
    self.tb.scalars(step, scalars)

  def flush_analysis(self) -> None:
    if self.pending_analysis:
      step, layers = self.pending_analysis
      self.pending_analysis = None
      self._layer_record(step, layers)

  def images(self, step: int) -> None:
    """Per metric of plots.PROFILE_METRICS: a layer x step heatmap and an l/L profile
    (one line per logged step); a figure costs ~0.1-0.3 s, so not every metric gets one."""
    by_metric: dict[str, list] = {}
    for r in read_jsonl(self.layers.path):
      for k, v in r.items():
        if k in plots.PROFILE_METRICS:
          by_metric.setdefault(k, []).append((r['step'], v))
    for metric, rows in by_metric.items():
      steps, values = [s for s, _ in rows], np.asarray([v for _, v in rows], float)
      for kind, draw in (('heatmap', plots.heatmap), ('profile', plots.profile)):
        self.tb.image(step, f'images/{kind}/{metric}', *draw(metric, steps, values))

  def log_eval(self, step: int, scalars: dict) -> None:
    self.eval.write({'step': step, **scalars})
    self.tb.scalars(step, scalars)
    self.tb.flush()


def evaluate(eval_fn, params, batches: list[dict], hops: list[int], step) -> dict[str, float]:
  """eval/loss over the fixed eval set and eval/acc_hop<k> per k-hop value."""
  sums = None
  for batch in batches:
    out = eval_fn(params, batch, step)
    sums = out if sums is None else jax.tree.map(lambda a, b: a + b, sums, out)
  sums = jax.device_get(sums)
  result = {'eval/loss': float(sums['loss_sum'] / max(sums['weight_sum'], 1.0))}
  for k, c, n in zip(hops, sums['correct'], sums['count']):
    result[f'eval/acc_hop{k}'] = float(c / max(n, 1.0))
  return result


def train_rung(cfg, workdir: str, *, name: str = '', stop_at_step: int | None = None) -> dict:
  """Trains (or resumes, or skips if finished) one rung in workdir; returns its summary.

  stop_at_step simulates a kill just before that step (no final checkpoint); tests use it.
  """
  summary_path = os.path.join(workdir, 'summary.json')
  if os.path.exists(summary_path):
    with open(summary_path) as f:
      return json.load(f)
  run = _Run(cfg, workdir, name)
  try:
    with _Preemption() as preempt:
      result = run.loop(preempt, stop_at_step)
  finally:
    run.close()
  if run.lead and 'status' not in result:
    with open(summary_path, 'w') as f:
      json.dump(result, f, indent=2)
  return result


class _Run:
  """State of one rung's training: compiled steps, data, checkpoints, logs and clocks."""

  def __init__(self, cfg, workdir: str, name: str):
    self.cfg, self.workdir, self.name = cfg, workdir, name
    self.lead = jax.process_index() == 0
    os.makedirs(workdir, exist_ok=True)
    if self.lead:
      with open(os.path.join(workdir, 'config.json'), 'w') as f:
        f.write(cfg.to_json_best_effort(indent=2))
    t = cfg.train
    model, stats_model = make_model(cfg), make_model(cfg, collect_stats=True)
    tx = make_optimizer(cfg)
    self.plan = sharding.make_plan(cfg, model, tx, init_state)
    self.state = self.plan.init(init_state, model, tx, t.seed, cfg.data.seq_len)
    self.params, self.non_embedding_params = param_counts(self.state['params'])
    init_blocks = jax.device_get(self.state['params']['blocks'])  # for param_rotation

    self.it = data.train_iterator(cfg.data, t.seed, jax.process_index(), jax.process_count())
    self.ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), t.keep_checkpoints)
    start = self.ckpt.latest_step()
    if start is not None:
      self.state, data_state = self.ckpt.restore(start, abstract(self.state))
      self.it.set_state(data_state)
    self.logs = _Logs(workdir, start, tb_layer_subset(cfg.model.num_layers, cfg.metrics.tb_layers)
                      ) if self.lead else None
    if self.lead:
      m = cfg.model
      self.logs.tb.hparams({'d_model': m.d_model, 'num_layers': m.num_layers, 'params': self.params,
                            'non_embedding_params': self.non_embedding_params, 'block': m.block,
                            'norm': m.norm, 'residual': m.get('residual', 'standard'),
                            'mlp': m.mlp, 'lr': cfg.optim.lr, 'steps': t.steps})
    self.start = start or 0

    self.hops = data.hop_values(cfg.data)
    self.eval_set = [self.plan.global_batch(b) for b in data.eval_batches(
        cfg.data, t.seed, cfg.data.eval_batches, jax.process_index(), jax.process_count())]
    lr_fn = schedule(cfg)
    self.batch = self.plan.global_batch(next(self.it))
    t0 = time.perf_counter()
    self.plain = self._compile(make_train_step(model, tx, lr_fn, cfg))
    self.compile_s = time.perf_counter() - t0
    self.with_stats = self._compile(make_train_step(stats_model, tx, lr_fn, cfg))
    p = self.plan
    with p.context():
      self.eval_fn = jax.jit(make_eval_step(model, self.hops, cfg),
                             in_shardings=(p.state['params'], p.batch, p.replicated),
                             out_shardings=p.replicated).lower(
          self.state['params'], self.eval_set[0], self.state['step']).compile(ops.compiler_options())
    host_memory.keep_freed_memory()  # the steps' buffers are reused from here on
    self.analyzer = Analyzer(model, init_blocks, jax.tree.map(
        lambda a: a[:cfg.metrics.analysis_batch_size], self.eval_set[0]), t.seed, cfg
                             ) if cfg.metrics.analysis_every else None
    self.analysis_scalars: dict[str, float] = {}
    self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    self.clock = {'t': time.perf_counter(), 'step': self.start, 'busy': 0.0,
                  'tokens': 0, 'seconds': 0.0}
    self.last_loss = float('nan')
    self.eval_scalars: dict[str, float] = {}

  def _compile(self, step_fn):
    return self.plan.compile_train_step(step_fn, self.state, self.batch)

  def loop(self, preempt: _Preemption, stop_at_step: int | None) -> dict:
    """Runs steps start..steps-1; outputs of step s are checked while step s+1 runs."""
    t, steps = self.cfg.train, self.cfg.train.steps
    pending = None
    for s in range(self.start, steps):
      if s == stop_at_step:
        self._finish(pending)
        return {'status': 'stopped', 'step': s}
      if s > self.start:
        self.batch = self.plan.global_batch(next(self.it))
      if self.analyzer and (s % self.cfg.metrics.analysis_every == 0 or s == steps - 1):
        self._analyse(s)  # the last one shares the final logging step's record
      step_fn = self.with_stats if s % t.log_every == 0 or s == steps - 1 else self.plain
      self.state, out = step_fn(self.state, self.batch)
      self._finish(pending)
      pending = (s, out)
      done = s + 1
      due_eval = done % t.eval_every == 0 or done == steps
      due_ckpt = done % t.checkpoint_every == 0 or done == steps or preempt.requested
      if due_eval or due_ckpt:
        self._finish(pending)
        pending = None
        self._eval_and_save(done, due_eval, due_ckpt)
      if preempt.requested:
        print(f'{self.name} SIGTERM: checkpoint saved at step {done}; rerun the same '
              'command to resume', flush=True)
        return {'status': 'preempted', 'step': done}
    return self._summary()

  def _finish(self, pending) -> None:
    """Checks a dispatched step's outputs and, on logging steps, writes its logs."""
    if pending is None:
      return
    s, out = pending
    if not bool(out['ok']):
      bad = np.flatnonzero(~np.isfinite(np.asarray(out['layer_grad_norm'])))
      where = f' (first in block {bad[0] + 1})' if bad.size else ''
      raise NonFiniteError(f'non-finite loss or gradient at step {s}{where}; the last good '
                           f'checkpoint is kept in {os.path.join(self.workdir, "checkpoints")}')
    self.last_loss = float(out['loss'])
    if 'layers' not in out:
      return
    c = self.clock
    now = time.perf_counter()
    dt, n = now - c['t'] - c['busy'], s + 1 - c['step']
    tps = n * self.tokens_per_step / dt if dt > 0 and n > 0 else 0.0
    if c['step'] > self.start:  # steady state: skip the interval holding the first step
      c['tokens'] += n * self.tokens_per_step
      c['seconds'] += dt
    c.update(t=now, step=s + 1, busy=0.0)
    scalars = {'train/loss': self.last_loss, 'train/grad_norm': float(out['grad_norm']),
               'train/param_norm': float(out['param_norm']),
               'train/logit_max': float(out['logit_max']),
               'train/lr': float(out['lr']), 'perf/tokens_per_sec': tps,
               'perf/step_ms': 1e3 * dt / max(n, 1)}
    if self.lead:
      self.logs.log_train(s, scalars, jax.device_get(out['layers']))
    steps = self.cfg.train.steps
    eta = (steps - s - 1) * self.tokens_per_step / tps if tps else 0.0
    print(f'{self.name} step {s:>6}/{steps} loss {self.last_loss:.4f} | gnorm '
          f'{scalars["train/grad_norm"]:.3f} | lr {scalars["train/lr"]:.2e} | '
          f'{tps:,.0f} tok/s | ETA {_eta(eta)}', flush=True)

  def _eval_and_save(self, done: int, due_eval: bool, due_ckpt: bool) -> None:
    t0 = time.perf_counter()
    if due_eval:
      self.eval_scalars = evaluate(self.eval_fn, self.state['params'], self.eval_set, self.hops,
                                   self.state['step'])
      if self.lead:
        self.logs.log_eval(done, self.eval_scalars)
      print(f'{self.name} eval at step {done}: ' + ', '.join(
          f'{k.split("/")[1]} {v:.4f}' for k, v in self.eval_scalars.items()), flush=True)
    if due_ckpt:
      self.ckpt.save(done, self.state, self.it.get_state())
    self.clock['busy'] += time.perf_counter() - t0

  def _analyse(self, step: int) -> None:
    """Periodic analyses of the current parameters, recorded at `step` (before its update)."""
    t0 = time.perf_counter()
    layers, self.analysis_scalars = self.analyzer(self.state['params'], self.state['step'])
    if self.lead:
      self.logs.log_analysis(step, layers, self.analysis_scalars)
    self.clock['busy'] += time.perf_counter() - t0

  def _summary(self) -> dict:
    c, cfg = self.clock, self.cfg
    if self.lead:
      self.logs.flush_analysis()
      if cfg.metrics.images:
        self.logs.images(cfg.train.steps)
    return {
        'final_train_loss': self.last_loss,
        'final_eval_loss': self.eval_scalars.get('eval/loss', float('nan')),
        'params': self.params, 'non_embedding_params': self.non_embedding_params,
        'tokens': cfg.train.steps * self.tokens_per_step, 'steps': cfg.train.steps,
        'compile_s': self.compile_s,
        'tokens_per_sec': c['tokens'] / c['seconds'] if c['seconds'] else float('nan'),
        **{k.replace('eval/', 'final_eval_'): v for k, v in self.eval_scalars.items()
           if 'acc_hop' in k},
        **{'final_' + k.replace('/', '_'): v for k, v in self.analysis_scalars.items()},
    }

  def close(self) -> None:
    self.ckpt.close()
    if self.lead:
      self.logs.flush_analysis()
      self.logs.tb.close()
