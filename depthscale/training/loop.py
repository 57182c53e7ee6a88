"""The training loop of one rung: data, compiled steps, logs, eval, checkpoints, resume."""

from __future__ import annotations

import time

import jax
import numpy as np

from depthscale import data, storage
from depthscale.errors import WriteError
from depthscale.model import ops, recurrence, taper
from depthscale.model.transformer import make_model, param_counts
from depthscale.training import raster
from depthscale.training import (cpu_calibration, distributed, host_memory, procedures,
                                 programs, resume, sharding, tb_layout)
from depthscale.training.analysis import Analyzer, analysed_layers, compile_mode, evenly_spaced
from depthscale.training.checkpoint import Checkpointer, CheckpointError, abstract
from depthscale.training.optim import make_optimizer, schedule
from depthscale.training.preemption import Preemption
from depthscale.training.preflight import check_inputs
from depthscale.training.steps import init_state, make_eval_step, make_train_step
from depthscale.training.watchdog import Watchdog
from depthscale.training.writers import Jsonl, TensorBoard


COMPILE_WAIT_S = 3600.0  # how long a process waits for the others to finish compiling
# (the CPU collectives give a late peer only 30 s to join a first collective, and a process
# that misses the compilation cache, all but process 0, may compile for minutes)
FLUSH_SECONDS = 60.0  # logs reach a bucket at least this often (and before each checkpoint)


class NonFiniteError(RuntimeError):
  """Loss or gradients became non-finite; the last good checkpoint is kept."""


def _eta(seconds: float) -> str:
  s = int(max(seconds, 0))
  return f'{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}'


class _Logs:
  """Process-0 outputs of a rung: TensorBoard, layer_metrics.jsonl, train/eval/analysis logs."""

  def __init__(self, workdir: str, resume_step: int, tb_layers: list[int]):
    self.tb = TensorBoard(workdir, resume_step)  # drops the points a killed run wrote past it
    self.tb_layers = tb_layers
    self.charted: set[str] = set()  # per-layer metrics in this file's custom-scalars layout
    self.pending_analysis: tuple[int, dict] | None = None  # merged into that step's record
    self.layers = Jsonl(storage.join(workdir, 'layer_metrics.jsonl'), resume_step)
    self.train = Jsonl(storage.join(workdir, 'train_log.jsonl'), resume_step)
    self.analysis = Jsonl(storage.join(workdir, 'analysis_log.jsonl'), resume_step)
    # an eval at the restored step was written before its checkpoint: keep it (and show it
    # again in TensorBoard, which dropped it with the points at and after the restored step)
    self.eval = Jsonl(storage.join(workdir, 'eval_log.jsonl'), resume_step + 1)
    for r in storage.read_jsonl(self.eval.path):
      if r['step'] == resume_step:
        self.tb.scalars(resume_step, {k: v for k, v in r.items() if k != 'step'})
    self.flushed = time.monotonic()
    self.files = (self.tb, self.layers, self.train, self.analysis, self.eval)

  def flush(self, step: int) -> None:
    """Every log up to date in its store (a bucket object is rewritten once per flush)."""
    try:
      for f in self.files:
        f.flush()
    except WriteError as e:
      raise WriteError(f'logs at step {step}: {e}') from e
    self.flushed = time.monotonic()

  def close(self) -> None:
    self.flush_analysis()
    for f in self.files:
      f.close()

  def log_train(self, step: int, scalars: dict, layers: dict | None) -> None:
    self.train.write({'step': step, **scalars})
    self.tb.scalars(step, scalars)
    if layers:
      self._layer_record(step, layers)
    if time.monotonic() - self.flushed > FLUSH_SECONDS:
      self.flush(step)

  def _layer_record(self, step: int, layers: dict) -> None:
    """One layer_metrics.jsonl record per step: the step's analyses, if any, merged in."""
    if self.pending_analysis and self.pending_analysis[0] == step:
      layers = {**layers, **self.pending_analysis[1]}
      self.pending_analysis = None
    if self.pending_analysis and self.pending_analysis[0] < step:
      self.flush_analysis()  # an analysis at a step without a logging record: its own record
    self.layers.write({'step': step, **{k: [float(v) for v in vs] for k, vs in layers.items()}})
    self.tb.scalars(step, {tb_layout.layer_tag(k, l + 1): vs[l]
                           for k, vs in layers.items() for l in self.tb_layers_of(vs)})
    if not set(layers) <= self.charted:  # the first record, the first analysis
      self.charted |= set(layers)
      self.tb.layout(step, tb_layout.layer_layout(self.charted))

  def tb_layers_of(self, values) -> list[int]:
    """The TensorBoard layers of one metric: tb_layers, or for a metric computed on a subset
    of layers (NaN elsewhere) at most as many of its own, evenly spaced."""
    measured = np.flatnonzero(~np.isnan(np.asarray(values, float)))
    if len(measured) == len(values):
      return self.tb_layers
    return [int(measured[i]) for i in evenly_spaced(len(measured), len(self.tb_layers))]

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
    """Per metric of raster.PROFILE_METRICS: a layer x step heatmap and an l/L profile
    (one line per logged step), drawn by training.raster."""
    by_metric: dict[str, list] = {}
    self.layers.flush()
    for r in storage.read_jsonl(self.layers.path):
      for k, v in r.items():
        if k in raster.PROFILE_METRICS:
          by_metric.setdefault(k, []).append((r['step'], v))
    for metric, rows in by_metric.items():
      steps, values = [s for s, _ in rows], np.asarray([v for _, v in rows], float)
      for kind, draw in (('heatmap', raster.heatmap), ('profile', raster.profile)):
        self.tb.image(step, f'images/{kind}/{metric}', draw(metric, steps, values).png())

  def log_eval(self, step: int, scalars: dict) -> None:
    self.eval.write({'step': step, **scalars})
    self.tb.scalars(step, scalars)


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


def train_rung(cfg, workdir: str, *, name: str = '', stop_at_step: int | None = None,
               allow_config_change: bool = False) -> dict:
  """Trains (or resumes, or skips if finished) one rung in workdir; returns its summary.

  Bad input (data, mesh, a resume config that changes the computed function or the data
  order unless allow_config_change; see resume.check_config) raises ConfigError before
  anything is written. stop_at_step simulates a kill just before that step (no final
  checkpoint), or at train.steps one between the final checkpoint and summary.json; tests
  use it.
  """
  check_inputs(cfg, workdir)
  changes = resume.check_config(cfg, workdir, allow_config_change)
  hooks = procedures.Hooks(cfg, workdir)  # the post-hoc procedures cfg switches on
  summary_path = storage.join(workdir, 'summary.json')
  if storage.exists(summary_path):
    summary = storage.read_json(summary_path)
    if summary['steps'] == cfg.train.steps:  # finished; a longer train.steps trains on
      return summary
  with Watchdog(cfg.train.watchdog_seconds, name, jax.process_index()) as watchdog:
    run = None
    try:
      run = _Run(cfg, workdir, name, changes, watchdog, hooks)
      with Preemption(name, run.ckpt.kept) as preempt:
        try:
          result = run.loop(preempt, stop_at_step)
        except WriteError:
          raise  # a store failed: nothing more is written to it or waited for
        except BaseException:
          run.close()
          raise
        run.close()
      if run.lead and 'status' not in result:
        storage.write_json(summary_path, result, indent=2)
    except CheckpointError:
      raise  # names the last complete checkpoint
    except WriteError as e:
      raise WriteError(f'{e}; ' + (run.ckpt.kept() if run else 'the checkpoints are as before '
                                   'this run: rerun to resume')) from e
  return result


class _Builders:
  """What a rung's programs are built from: one per program key in a process
  (depthscale.training.programs), so that a rung whose config differs from an earlier one's
  only in its rate or seed reuses that rung's traced, lowered and compiled programs."""

  def __init__(self, cfg):
    self.model, stats_model = make_model(cfg), make_model(cfg, collect_stats=True)
    self.tx, lr_fn = make_optimizer(cfg), schedule(cfg)
    self.plan = sharding.make_plan(cfg, self.model, self.tx, init_state)
    self.hops = data.hop_values(cfg.data)
    self.train_step = make_train_step(self.model, self.tx, lr_fn, cfg)
    self.stats_step = make_train_step(stats_model, self.tx, lr_fn, cfg)
    self.eval_step = make_eval_step(self.model, self.hops, cfg)


class _Run:
  """State of one rung's training: compiled steps, data, checkpoints, logs and clocks."""

  def __init__(self, cfg, workdir: str, name: str, config_changes: dict[str, tuple],
               watchdog: Watchdog, hooks: procedures.Hooks):
    self.cfg, self.workdir, self.name, self.watchdog = cfg, workdir, name, watchdog
    watchdog.enter('start-up')
    self.lead = jax.process_index() == 0
    self.data_info = data.data_info(cfg.data)
    if 'sha256' in self.data_info:
      print(f'{name} data {self.data_info["corpus"]}: {self.data_info["bytes"]:,} bytes, '
            f'sha256 {self.data_info["sha256"]}', flush=True)
    t = cfg.train
    b = programs.kept(cfg, 'rung', lambda: _Builders(cfg))  # an earlier rung's: its programs
    model, tx, self.plan = b.model, b.tx, b.plan
    self.state = self.plan.init(init_state, model, tx, t.seed, cfg.data.seq_len)
    total, non_embedding = param_counts(self.state['params'])
    masked = taper.inactive_params(cfg.model)  # a tapered MLP counts its active units only
    self.params, self.non_embedding_params = total - masked, non_embedding - masked
    self.compute_params = recurrence.compute_params(cfg.model, self.state['params'],
                                                    self.non_embedding_params)
    self.hooks = hooks  # their starts (a checkpoint of this rung wins), then transforms
    params, lines = hooks.start(cfg, workdir, self.plan.replicated, self.state['params'])
    if lines:
      self.state = {**self.state, 'params': jax.device_put(params, self.plan.state['params'])}
    for line in lines if self.lead else ():
      print(f'{name} {line}', flush=True)
    hooks.prepare(cfg, model, self.state['params'])
    # param_rotation's reference, on device (the train step donates the state's own buffers)
    init_blocks = sharding.owned_copy(self.state['params']['blocks'],
                                      self.plan.state['params']['blocks']
                                      ) if cfg.metrics.analysis_every else None
    self.any_process = distributed.AnyProcess(self.plan.mesh)

    self.it = data.train_iterator(cfg.data, t.seed, jax.process_index(), jax.process_count())
    storage.makedirs(workdir)  # the plan and the data are checked: write from here
    distributed.barrier('initialized', COMPILE_WAIT_S)  # before orbax's first collective
    self.ckpt = Checkpointer(storage.join(workdir, 'checkpoints'), t.keep_checkpoints)
    watchdog.enter('restore')
    restored, start = self.ckpt.restore_latest(abstract(self.state)), 0
    if restored:
      start, self.state, data_state = restored
      self.it.set_state(data_state)
    if self.lead:
      resume.write_config(cfg, workdir, config_changes, start)
      storage.write_json(storage.join(workdir, 'data_info.json'), self.data_info, indent=2)
    self.logs = _Logs(workdir, start, evenly_spaced(cfg.model.num_layers, cfg.metrics.tb_layers)
                      ) if self.lead else None
    if self.lead and not start:  # a resumed run's event files hold them already
      m = cfg.model
      self.logs.tb.hparams({'d_model': m.d_model, 'num_layers': m.num_layers, 'params': self.params,
                            'non_embedding_params': self.non_embedding_params, 'block': m.block,
                            'norm': m.norm, 'residual': m.get('residual', 'standard'),
                            'mlp': m.mlp, 'lr': cfg.optim.lr, 'steps': t.steps})
    self.start = start

    self.hops = b.hops
    self.eval_set = [self.plan.global_batch(b) for b in data.eval_batches(
        cfg.data, t.seed, cfg.data.eval_batches, jax.process_index(), jax.process_count())]
    self.lr = self.plan.scalar(cfg.optim.lr)  # an argument of the train step, not a constant
    self.batch = self.plan.global_batch(next(self.it))
    watchdog.pause()  # compiling: long, and no other process is involved
    t0 = time.perf_counter()
    chosen = storage.join(workdir, 'cpu_options.json')
    resumed = storage.read_json(chosen)['choice'] if start and storage.exists(chosen) else None
    self.plain, self.cpu_options = cpu_calibration.compile_plain(
        self.plan, b.train_step, self.state, self.batch, self.lr,
        t.cpu_options, t.steps - start, resumed)
    self.compile_s = time.perf_counter() - t0 - (self.cpu_options or {}).get('seconds', 0.0)
    if self.cpu_options and self.lead:
      print(cpu_calibration.describe(name, self.cpu_options), flush=True)
      if self.cpu_options['source'] != 'resumed':  # keeps the times of the choice
        storage.write_json(chosen, self.cpu_options, indent=2)
    self.with_stats = self.plan.compile_train_step(
        b.stats_step, self.state, self.batch,
        cpu_set=self.cpu_options['choice'] if self.cpu_options else cpu_calibration.DEFAULT)
    p = self.plan
    self.eval_fn = p.compile(b.eval_step,
                             (p.state['params'], p.batch, p.replicated), p.replicated,
                             self.state['params'], self.eval_set[0], self.state['step'])
    opt_level = ops.CPU_OPT_LEVELS[compile_mode(cfg, self.compute_params)]
    self.analyzer = Analyzer(model, p, init_blocks, self.eval_set[0],
                             cfg.metrics.analysis_batch_size, t.seed, cfg, analysed_layers(cfg),
                             opt_level) if cfg.metrics.analysis_every else None
    host_memory.keep_freed_memory(p.platform)  # the steps' buffers are reused from here on
    distributed.barrier('compiled', COMPILE_WAIT_S)  # start the first collectives together
    self.analysis_scalars: dict[str, float] = {}
    self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    self.clock = {'t': time.perf_counter(), 'step': self.start, 'busy': 0.0,
                  'tokens': 0, 'seconds': 0.0}
    self.last_loss = float('nan')
    self.eval_scalars: dict[str, float] = {}

  def loop(self, preempt: Preemption, stop_at_step: int | None) -> dict:
    """Runs steps start..steps-1; outputs of step s are checked while step s+1 runs."""
    t, steps = self.cfg.train, self.cfg.train.steps
    pending = None
    if self.start == steps:  # restored at the final checkpoint: killed before its summary
      self._restore_final()
    for s in range(self.start, steps):
      if s == stop_at_step:
        self._finish(pending)
        return {'status': 'stopped', 'step': s}
      if s > self.start:
        self.watchdog.enter('data', s)
        self.batch = self.plan.global_batch(next(self.it))
      self.state = self.hooks.before_step(self.state, s, self.batch)
      if self.analyzer and (s % self.cfg.metrics.analysis_every == 0 or s == steps - 1):
        self._analyse(s)  # the last one shares the final logging step's record
      step_fn = self.with_stats if s % t.log_every == 0 or s == steps - 1 else self.plain
      self.watchdog.enter('train step', s)
      self.state, out = step_fn(self.state, self.batch, self.lr)
      self.ckpt.check()  # a failed background save ends the run at once
      preempted = self.any_process(preempt.requested)  # the same step on every process
      self._finish(pending)
      pending = (s, out)
      done = s + 1
      due_eval = done % t.eval_every == 0 or done == steps
      due_ckpt = done % t.checkpoint_every == 0 or done == steps or preempted
      if due_eval or due_ckpt:
        self._finish(pending)
        pending = None
        self._eval_and_save(done, due_eval, due_ckpt)
      if preempted:
        print(f'{self.name} SIGTERM: checkpoint saved at step {done}; rerun the same '
              'command to resume', flush=True)
        return {'status': 'preempted', 'step': done}
    if stop_at_step == steps:
      return {'status': 'stopped', 'step': steps}
    return self._summary()

  def _finish(self, pending) -> None:
    """Checks a dispatched step's outputs and, on logging steps, writes its logs."""
    if pending is None:
      return
    s, out = pending
    self.watchdog.enter('train step', s)
    if not bool(out['ok']):
      bad = np.flatnonzero(~np.isfinite(np.asarray(out['layer_grad_norm'])))
      where = f' (first in block {bad[0] + 1})' if bad.size else ''
      last = self.ckpt.latest_step()
      kept = ('no checkpoint was saved before it' if last is None else
              f'the last good checkpoint is step {last} in {self.ckpt.directory}')
      raise NonFiniteError(f'non-finite loss or gradient at step {s}{where}; {kept}')
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
      self.watchdog.enter('eval', done)
      self.eval_scalars = evaluate(self.eval_fn, self.state['params'], self.eval_set, self.hops,
                                   self.state['step'])
      if self.lead:
        self.logs.log_eval(done, self.eval_scalars)
      print(f'{self.name} eval at step {done}: ' + ', '.join(
          f'{k.split("/")[1]} {v:.4f}' for k, v in self.eval_scalars.items()), flush=True)
    if due_ckpt:
      self.watchdog.enter('checkpoint', done)
      if self.lead:  # the logs up to the checkpoint persist before it: a resume keeps them
        self.logs.flush(done)
      self.ckpt.save(done, self.state, self.it.get_state())
    self.clock['busy'] += time.perf_counter() - t0

  def _analyse(self, step: int) -> None:
    """Periodic analyses of the current parameters, recorded at `step` (before its update)."""
    t0 = time.perf_counter()
    self.watchdog.enter('analysis', step)
    layers, self.analysis_scalars = self.analyzer(self.state['params'], self.state['step'])
    if self.lead:
      self.logs.log_analysis(step, layers, self.analysis_scalars)
    self.clock['busy'] += time.perf_counter() - t0

  def _restore_final(self) -> None:
    """Final values of a rung restored at its last step: the eval recomputed from the
    checkpointed parameters; the train loss and analyses, taken from the parameters before
    the last update (which the checkpoint no longer holds), from its logs."""
    self.last_loss, self.analysis_scalars = resume.final_logged(self.workdir, self.cfg.train.steps)
    self.eval_scalars = evaluate(self.eval_fn, self.state['params'], self.eval_set, self.hops,
                                 self.state['step'])

  def _summary(self) -> dict:
    c, cfg = self.clock, self.cfg
    if self.lead:
      self.logs.flush_analysis()
      if cfg.metrics.images:
        self.watchdog.enter('images', cfg.train.steps)
        self.logs.images(cfg.train.steps)
    return {
        'final_train_loss': self.last_loss,
        'final_eval_loss': self.eval_scalars.get('eval/loss', float('nan')),
        'params': self.params, 'non_embedding_params': self.non_embedding_params,
        'compute_params': self.compute_params,
        'tokens': cfg.train.steps * self.tokens_per_step, 'steps': cfg.train.steps,
        'compile_s': self.compile_s, **self.hooks.final(self.state['params']),
        **({'cpu_options': self.cpu_options['choice']} if self.cpu_options else {}),
        **({'data_sha256': self.data_info['sha256']} if 'sha256' in self.data_info else {}),
        'tokens_per_sec': c['tokens'] / c['seconds'] if c['seconds'] else
                          resume.logged_tokens_per_sec(self.workdir, self.tokens_per_step),
        **{k.replace('eval/', 'final_eval_'): v for k, v in self.eval_scalars.items()
           if 'acc_hop' in k},
        **{'final_' + k.replace('/', '_'): v for k, v in self.analysis_scalars.items()},
    }

  def close(self) -> None:
    self.watchdog.enter('checkpoint wait')
    self.ckpt.close()
    if self.lead:
      self.logs.close()
