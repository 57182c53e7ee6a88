"""The XLA-CPU dot library of a rung's train step, chosen by timing it (train.cpu_options).

Where the step may take oneDNN (ops.onednn_allowed: an x86 host, one CPU device, no JAX
compilation cache), oneDNN's dots or XLA's own (Eigen) are faster depending on the host and
the shape. 'auto' compiles the plain step with each set of ops.CPU_OPTION_SETS (where the
run is long enough to pay for that), times them on a copy of the state and keeps the fastest
(oneDNN unless another is faster beyond the noise); the choice is cached per host and per
lowered step (its shapes and model) in a JSON file, so a host measures a shape once.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
import time

import jax
import jaxlib
import numpy as np

from depthscale import host_cache
from depthscale.model import ops
from depthscale.training import sharding

DEFAULT = 'onednn'  # the set a rung takes unless calibrated, cached or configured otherwise
CHOICES = ('auto', *ops.CPU_OPTION_SETS)
CACHE_ENV = 'DEPTHSCALE_CPU_OPTIONS_CACHE'  # the cache file (default: see cache_path)
WARMUP, TIMED = 1, 3  # rounds per candidate, interleaved; the median of the timed ones counts
# 'auto' calibrates when a step this much faster would pay the calibration back within the
# run (Eigen's ~5% behind oneDNN on config S, benchmarks/NOTES.md change 6)
PAYBACK_GAIN = 0.05


def cache_path() -> str:
  """$DEPTHSCALE_CPU_OPTIONS_CACHE, else cpu_options.json in the host's cache directory
  (depthscale.host_cache)."""
  return host_cache.path('cpu_options.json', CACHE_ENV)


def host() -> str:
  """What the timings depend on besides the program: CPU model and features, usable cores,
  jax / jaxlib versions and XLA_FLAGS."""
  info = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        info.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
  flags = hashlib.sha256(info.get('flags', '').encode()).hexdigest()[:8]
  return (f'{info.get("model name") or platform.processor() or platform.machine()}, '
          f'{cores} cores, cpu flags {flags}, jax {jax.__version__}, jaxlib {jaxlib.__version__}'
          f', XLA_FLAGS {os.environ.get("XLA_FLAGS", "")!r}')


def cache_key(lowered) -> str:
  """host() and the lowered step's text (shapes, model, shardings), hashed."""
  digest = lambda s: hashlib.sha256(s.encode()).hexdigest()[:16]
  return f'{digest(host())}-{digest(lowered.as_text())}'


def read_cache(path: str) -> dict:
  """The cache's entries; {} for a missing file, and with one warning line for an unreadable
  or corrupt one (it is then rewritten)."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      entries = json.load(f)
    if not isinstance(entries, dict):
      raise ValueError('not a JSON object')
    return entries
  except (OSError, ValueError) as e:
    print(f'warning: CPU options cache {path} ignored ({e})', file=sys.stderr, flush=True)
    return {}


def write_cache(path: str, key: str, entry: dict) -> bool:
  """Adds one entry (host_cache.write: atomically; False with one warning line where the
  file cannot be written)."""
  entries = {**read_cache(path), key: entry}
  return host_cache.write(path, json.dumps(entries, indent=1, sort_keys=True).encode(),
                          'CPU options cache')


def _timed(step, state, batch, lr) -> tuple:
  t0 = time.perf_counter()
  state, out = step(state, batch, lr)
  jax.block_until_ready((state, out))
  return state, 1e3 * (time.perf_counter() - t0)


def time_steps(steps: dict, state, batch, lr, warm: tuple = ()) -> dict:
  """name -> the ms of each of TIMED steps of that compiled step, after WARMUP, the names
  interleaved (A B A B ...) and chained on a copy of `state` (the steps donate it; `state`
  itself is untouched). warm: the names already run once (their warm-up is done)."""
  state = sharding.owned_copy(state)
  times = {name: [] for name in steps}
  for r in range(WARMUP + TIMED):
    for name, step in steps.items():
      if r < WARMUP and name in warm:
        continue
      state, ms = _timed(step, state, batch, lr)
      if r >= WARMUP:
        times[name].append(ms)
  return times


def choose(times: dict) -> str:
  """The set with the fastest median step, if each of its timed steps beat every one of
  DEFAULT's; else DEFAULT (a difference within the noise, e.g. of a busy host)."""
  best = min(times, key=lambda name: np.median(times[name]))
  return best if max(times[best]) < min(times[DEFAULT]) else DEFAULT


def worth_calibrating(steps_left: int, step_ms: float, compile_s: float, sets: int) -> bool:
  """Whether a step PAYBACK_GAIN faster over the run's remaining steps would pay for the
  calibration: one more compile per other set and (WARMUP + TIMED) steps per set."""
  cost_s = (sets - 1) * compile_s + sets * (WARMUP + TIMED) * step_ms / 1e3
  return steps_left * step_ms / 1e3 * PAYBACK_GAIN >= cost_s


def compile_plain(plan, step_fn, state, batch, lr, mode: str, steps_left: int,
                  resumed: str | None = None) -> tuple:
  """(the plain train step compiled, a record of how its CPU options were chosen, or None
  where there is no choice). mode is train.cpu_options: a set's name, or 'auto': the choice
  of the run this one resumes (`resumed`: it then computes what that run would have), else
  the cached choice for this host and step, else a calibration if worth_calibrating, else
  DEFAULT. The record's 'seconds': the wall time 'auto' added to the one compile a rung needs.
  lr: the step's learning-rate argument (Plan.scalar), for the timed steps."""
  lowered = plan.lower_train_step(step_fn, state, batch)
  if not ops.onednn_allowed(plan.platform, plan.mesh.size):
    return plan.compile_lowered(lowered), None
  if mode != 'auto':
    return plan.compile_lowered(lowered, cpu_set=mode), {'choice': mode, 'source': 'config'}
  if resumed in ops.CPU_OPTION_SETS:
    return plan.compile_lowered(lowered, cpu_set=resumed), {'choice': resumed, 'source': 'resumed'}
  t0 = time.perf_counter()
  path, key = cache_path(), cache_key(lowered)
  cached = read_cache(path).get(key)
  if (isinstance(cached, dict) and cached.get('choice') in ops.CPU_OPTION_SETS
      and isinstance(cached.get('ms'), dict)):
    seconds = time.perf_counter() - t0
    return (plan.compile_lowered(lowered, cpu_set=cached['choice']),
            {**cached, 'source': 'cache', 'cache': path, 'seconds': seconds})
  t1 = time.perf_counter()
  steps = {DEFAULT: plan.compile_lowered(lowered, cpu_set=DEFAULT)}
  compile_s = time.perf_counter() - t1
  _, first_ms = _timed(steps[DEFAULT], sharding.owned_copy(state), batch, lr)
  record = {'choice': DEFAULT, 'source': 'short run'}
  if worth_calibrating(steps_left, first_ms, compile_s, len(ops.CPU_OPTION_SETS)):
    steps.update({name: plan.compile_lowered(lowered, cpu_set=name)
                  for name in ops.CPU_OPTION_SETS if name != DEFAULT})
    times = time_steps(steps, state, batch, lr, warm=(DEFAULT,))
    entry = {'choice': choose(times), 'host': host(), 'date': datetime.date.today().isoformat(),
             'ms': {name: float(np.median(t)) for name, t in times.items()},
             'timed_ms': times, 'load': os.getloadavg()[0]}
    record = {**entry, 'source': 'calibrated', 'cache': path if write_cache(path, key, entry)
              else None}
  record['seconds'] = time.perf_counter() - t0 - compile_s
  return steps[record['choice']], record


def describe(name: str, record: dict) -> str:
  """One line: the rung's CPU options and how they were chosen."""
  line = f'{name} cpu options: {record["choice"]}'
  if record['source'] in ('config', 'resumed'):
    return line + (' (train.cpu_options)' if record['source'] == 'config' else
                   " (the resumed run's choice)")
  if record['source'] == 'short run':
    return line + (f' (the default: the run is too short to pay for a calibration; '
                   f'{record["seconds"]:.1f} s to find out)')
  how = (f'calibrated in {record["seconds"]:.1f} s' if record['source'] == 'calibrated'
         else f'measured {record["date"]}') + f' at load {record.get("load", float("nan")):.1f}'
  where = f'cached in {record["cache"]}' if record['cache'] else 'not cached'
  times = ', '.join(f'{n} {ms:,.1f} ms' for n, ms in record['ms'].items())
  if record['choice'] != min(record['ms'], key=record['ms'].get):
    times += ': within the noise, the default kept'
  return f'{line} ({times}; {how}, {where})'
