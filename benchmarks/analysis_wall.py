"""The periodic analyses' share of real rungs' wall time, measured end to end.

  PYTHONPATH=. python benchmarks/analysis_wall.py [--rungs=FILE[:ARG]@RUNG[@FIELD=VALUE...],...]
      [--repeats=3] [--code=DIR,...]

Each rung trains from scratch in a fresh process (`train_rung` in a temporary workdir, timed
around the call: compiles, steps, analyses, eval, checkpoints and logs; not the imports), once
with its default metrics and once with `metrics.analysis_every=0`, in one round per repeat (the
host's load hits both alike; the order alternates between rounds). Per round, share =
(wall with - wall without) / wall with, and the same in process CPU time (all threads); printed
as the median and range over rounds. --code: other checkouts of the repository (e.g. the code
before a change), each timed with the analyses in the same rounds and against the same runs
without them. A rung's FIELD=VALUE overrides (e.g. `posthoc.init_from=` to train a fine-tuning
rung from scratch) apply to all of its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from benchmarks.common import table

# the compile-bound CPU rungs with the largest estimated shares (benchmarks/analysis_share.py)
RUNGS = ('experiments/repro_training_dynamics.py:smoke@pre_ln_s0',
         'experiments/repro_training_dynamics.py:smoke@pre_ln_quarter_s0',
         'experiments/repro_curse_of_depth.py:smoke@pre_ln_s0',
         'experiments/quickstart.py@pre_ln_L2',
         'experiments/quickstart.py@pre_ln_L8',
         'experiments/depth_mup_transfer.py@standard_L4_lr0.001',
         'experiments/posthoc.py@prune_n6@posthoc.init_from=@posthoc.prune_layers=0',
         'experiments/repro_training_dynamics.py@pre_ln_quarter_s0')

WORKER = '''
import json, sys, tempfile, time
from depthscale import experiment
from depthscale.training.loop import train_rung
(r, cfg), = experiment.resolve(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])
with tempfile.TemporaryDirectory() as workdir:
  t0, c0 = time.perf_counter(), time.process_time()
  train_rung(cfg, workdir, name=r.name)
  print(json.dumps({'wall': time.perf_counter() - t0, 'cpu': time.process_time() - c0}))
'''


def parse(rung: str) -> tuple[str, str, dict]:
  """FILE[:ARG]@RUNG[@FIELD=VALUE...] -> (config argument, rung name, overrides); a value is
  read as JSON where it parses, else kept as a string."""
  spec, name, *pairs = rung.split('@')
  overrides = {}
  for pair in pairs:
    field, _, value = pair.partition('=')
    try:
      overrides[field] = json.loads(value)
    except ValueError:
      overrides[field] = value
  return spec, name, overrides


def timed(code: str, rung: str, analyses: bool) -> dict:
  """{'wall', 'cpu'} seconds of one rung's train_rung, with the package at `code`."""
  spec, name, overrides = parse(rung)
  if not analyses:
    overrides = {**overrides, 'metrics.analysis_every': 0}
  env = {**os.environ, 'PYTHONPATH': code}
  done = subprocess.run([sys.executable, '-c', WORKER, spec, json.dumps(overrides), name],
                        env=env, cwd=code, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f'{rung} ({code}) failed:\n{done.stderr[-3000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--rungs', default=','.join(RUNGS))
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--code', default='', help='other checkouts to time with the analyses too')
  args = p.parse_args()
  codes = [os.getcwd()] + [os.path.abspath(c) for c in args.code.split(',') if c]
  runs = [(code, True) for code in codes] + [(codes[0], False)]
  times: dict = {}
  for r in range(args.repeats):
    print(f'round {r + 1}: load {os.getloadavg()[0]:.1f}', flush=True)
    for rung in args.rungs.split(','):
      for code, analyses in (runs if r % 2 == 0 else runs[::-1]):
        times.setdefault((rung, code, analyses), []).append(timed(code, rung, analyses))
  print(f'load at the end {os.getloadavg()[0]:.1f}')
  rows = []
  for rung in args.rungs.split(','):
    off = times[(rung, codes[0], False)]
    for code in codes:
      on = times[(rung, code, True)]
      row = [rung.split('/')[-1], os.path.basename(code)]
      for key in ('wall', 'cpu'):
        share = [100 * (a[key] - b[key]) / a[key] for a, b in zip(on, off)]
        row += [f"{np.median([a[key] for a in on]):.1f} / {np.median([b[key] for b in off]):.1f}",
                f'{np.median(share):.1f}% ({min(share):.1f}-{max(share):.1f})']
      rows.append(row)
  print(table(['rung', 'code', 'wall with / without (s)', 'wall share', 'CPU with / without (s)',
               'CPU share'], rows))


if __name__ == '__main__':
  main()
