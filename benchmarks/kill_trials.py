"""kill -9 at random points, then the same command: is the finished rung bitwise the
uninterrupted one?

  python benchmarks/kill_trials.py --trials 10 --workdir runs/kill_trials

A tiny quickstart rung (d_model 32, logging every step) runs once uninterrupted, then
--trials times with 1..--max_kills SIGKILLs, each at a random step after the first
checkpoint plus a random delay (so some land during a checkpoint save, between the final
checkpoint and summary.json, or in the summary), each followed by the same command; the
last run goes to the end. A trial is bitwise if its train/eval/layer logs (timing fields
aside) and its summary (compile time and throughput aside) equal the uninterrupted run's
and TensorBoard shows every scalar once per step with the uninterrupted values. Prints one
line per trial and "N/N bitwise".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=wrong-import-position
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from depthscale.results.loader import tensorboard_duplicates
from depthscale.storage import read_jsonl

RUNG = 'pre_ln_L2'
LOGS = ('train_log.jsonl', 'eval_log.jsonl', 'layer_metrics.jsonl', 'analysis_log.jsonl')
TIMING = ('compile_s', 'tokens_per_sec')


def command(workdir: str, steps: int, checkpoint_every: int, images: bool) -> list[str]:
  """The one command every launch of a trial repeats."""
  return [sys.executable, '-m', 'depthscale.main', '--config=experiments/quickstart.py',
          f'--workdir={workdir}', f'--rung={RUNG}', '--config.model.d_model=32',
          '--config.model.num_heads=2', '--config.data.seq_len=32', '--config.data.batch_size=4',
          '--config.data.eval_batches=1', f'--config.train.steps={steps}',
          '--config.train.log_every=1', f'--config.train.eval_every={checkpoint_every * 2}',
          f'--config.train.checkpoint_every={checkpoint_every}',
          f'--config.metrics.analysis_every={checkpoint_every * 3}',
          f'--config.metrics.images={images}', '--config.optim.warmup_steps=5']


def _lines(path: str) -> int:
  try:
    with open(path) as f:
      return sum(1 for line in f if line.endswith('\n'))
  except FileNotFoundError:
    return 0


def launch_and_kill(cmd: list[str], rung_dir: str, target: int, delay: float,
                    final: int | None = None) -> str | None:
  """Runs cmd until the train log holds `target` steps (or, with `final`, until the
  checkpoint of that step is complete), waits `delay` s and kills -9; returns where the
  kill landed, or None if the run finished first."""
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  log = os.path.join(rung_dir, 'train_log.jsonl')
  reached = ((lambda: os.path.isdir(os.path.join(rung_dir, 'checkpoints', str(final))))
             if final else (lambda: _lines(log) >= target))
  while proc.poll() is None and not reached():
    time.sleep(0.02)
  time.sleep(delay)
  if proc.poll() is not None:
    err = proc.stderr.read()
    if proc.returncode:
      raise SystemExit(f'a run failed (exit {proc.returncode}): {err[-2000:]}')
    return None
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  ckpts = sorted(int(d) for d in os.listdir(os.path.join(rung_dir, 'checkpoints')) if d.isdigit())
  return (f'step {_lines(log)} logged, checkpoints {ckpts}'
          + (', summary written' if os.path.exists(os.path.join(rung_dir, 'summary.json')) else ''))


def run_to_end(cmd: list[str]) -> None:
  res = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if res.returncode:
    raise SystemExit(f'a run failed (exit {res.returncode}): {res.stderr[-2000:]}')


def _strip(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if not k.startswith('perf/')} for r in records]


def _curve(rung_dir: str, tag: str) -> list[tuple[int, float]]:
  acc = EventAccumulator(rung_dir, size_guidance={'scalars': 0})
  acc.Reload()
  return [(e.step, e.value) for e in acc.Scalars(tag)]


def differences(ref: str, run: str) -> list[str]:
  """What differs between two finished rung directories ([] if bitwise the same)."""
  out = []
  for log in LOGS:
    a, b = (os.path.join(d, log) for d in (ref, run))
    if os.path.exists(a) and _strip(read_jsonl(a)) != _strip(read_jsonl(b)):
      out.append(log)
  with open(os.path.join(ref, 'summary.json')) as f, open(os.path.join(run, 'summary.json')) as g:
    a, b = json.load(f), json.load(g)
  same = lambda x, y: json.dumps(x) == json.dumps(y)  # NaN (an analysis of L2) equals NaN
  out += [f'summary {k}' for k in sorted(a.keys() | b.keys())
          if k not in TIMING and not same(a.get(k), b.get(k))]
  duplicates = tensorboard_duplicates(run)
  if duplicates:
    out.append(f'TensorBoard duplicates {duplicates}')
  out += [f'TensorBoard {tag}' for tag in ('train/loss', 'eval/loss')
          if _curve(ref, tag) != _curve(run, tag)]
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--trials', type=int, default=10)
  p.add_argument('--max_kills', type=int, default=3, help='kills per trial: 1..max_kills')
  p.add_argument('--steps', type=int, default=120)
  p.add_argument('--checkpoint_every', type=int, default=10)
  p.add_argument('--max_delay', type=float, default=1.0, help='seconds after the target step')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--final_window', action='store_true',
                 help='kill once the final checkpoint is complete, before summary.json (the '
                      'rung renders TensorBoard images there, which keeps the window open)')
  p.add_argument('--workdir', default=None, help='default: a fresh temporary directory')
  args = p.parse_args()
  logging.getLogger('tensorboard').setLevel(logging.ERROR)  # its line per purge on resume
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                        os.path.join(tempfile.gettempdir(), 'depthscale-kill-trials-jax-cache'))
  os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  root = args.workdir or tempfile.mkdtemp(prefix='kill_trials_')
  shutil.rmtree(root, ignore_errors=True)
  t0 = time.perf_counter()
  ref = os.path.join(root, 'reference')
  run_to_end(command(ref, args.steps, args.checkpoint_every, args.final_window))
  print(f'uninterrupted run: {time.perf_counter() - t0:.0f} s', flush=True)
  rng = random.Random(args.seed)
  bitwise = kills = duplicates = 0
  for trial in range(args.trials):
    workdir = os.path.join(root, f'trial{trial}')
    cmd = command(workdir, args.steps, args.checkpoint_every, args.final_window)
    rung_dir = os.path.join(workdir, RUNG)
    landed = []
    for _ in range(rng.randint(1, args.max_kills)):
      logged = _lines(os.path.join(rung_dir, 'train_log.jsonl'))
      target = rng.randint(max(args.checkpoint_every, logged), args.steps)
      where = launch_and_kill(cmd, rung_dir, target, rng.uniform(0, args.max_delay),
                              args.steps if args.final_window else None)
      if where is None:
        break
      landed.append(where)
    run_to_end(cmd)
    diff = differences(os.path.join(ref, RUNG), rung_dir)
    bitwise += not diff
    kills += len(landed)
    duplicates += sum(map(len, tensorboard_duplicates(rung_dir).values()))
    print(f'trial {trial}: {len(landed)} kill(s) [' + '; '.join(landed) + '] -> '
          + ('bitwise' if not diff else 'DIFFERENT: ' + ', '.join(diff)), flush=True)
  print(f'{bitwise}/{args.trials} bitwise ({kills} kills, {duplicates} duplicate TensorBoard '
        f'points, {time.perf_counter() - t0:.0f} s)', flush=True)


if __name__ == '__main__':
  main()
