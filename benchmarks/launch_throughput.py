"""Rungs per hour of one ladder run two ways on this host: `python -m depthscale.main` (one
rung after another) and `python -m depthscale.launch` (a local Ray instance, launch.cpus=1
per rung, as many rungs at once as the host has cores).

  PYTHONPATH=. python benchmarks/launch_throughput.py [--config=benchmarks/launch_ladder.py]
      [--rounds=2]

Each round runs both from scratch in fresh workdirs, the order alternating between rounds
(the host's load hits both alike); wall time is the whole command (start-up, Ray's start,
compiles, training, the table). Both use their ladder's own compilation cache, as a user's
run does (WORKDIR/.jax_cache, empty at the start; JAX_COMPILATION_CACHE_DIR is removed from
the environment). Prints each run, the load average around it, and the median ratio
launch / sequential of rungs per hour.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.common import table

MODES = {'sequential': 'depthscale.main', 'launch': 'depthscale.launch'}


def run(mode: str, config: str, workdir: str) -> float:
  """Seconds the whole command takes; raises if it fails."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('RAY_ADDRESS', 'JAX_COMPILATION_CACHE_DIR')}
  t0 = time.perf_counter()
  res = subprocess.run([sys.executable, '-m', MODES[mode], f'--config={config}',
                        f'--workdir={workdir}'], capture_output=True, text=True, env=env)
  seconds = time.perf_counter() - t0
  if res.returncode:
    raise RuntimeError(f'{mode} exited {res.returncode}: {res.stderr[-2000:]}')
  return seconds


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--config', default='benchmarks/launch_ladder.py')
  parser.add_argument('--rounds', type=int, default=2)
  args = parser.parse_args()
  from depthscale.experiment import load_module, rungs_of, split_arg  # pylint: disable=import-outside-toplevel
  path, arg = split_arg(args.config)
  n = len(rungs_of(load_module(path), arg))
  rows, per_hour = [], {m: [] for m in MODES}
  for k in range(args.rounds):
    for mode in (MODES if k % 2 == 0 else reversed(list(MODES))):
      workdir = tempfile.mkdtemp(prefix=f'launch-bench-{mode}-')
      load0 = os.getloadavg()[0]
      seconds = run(mode, args.config, workdir)
      shutil.rmtree(workdir)
      per_hour[mode].append(n / seconds * 3600)
      rows.append([k, mode, n, f'{seconds:.0f}', f'{per_hour[mode][-1]:.0f}',
                   f'{load0:.1f} -> {os.getloadavg()[0]:.1f}'])
  print(table(['round', 'mode', 'rungs', 'wall s', 'rungs/h', 'load (1 min)'], rows))
  ratios = np.array(per_hour['launch']) / np.array(per_hour['sequential'])
  print(f'launch / sequential, rungs per hour: median {np.median(ratios):.2f}x '
        f'(rounds: {", ".join(f"{r:.2f}" for r in ratios)}); {os.cpu_count()} cores')


if __name__ == '__main__':
  main()
