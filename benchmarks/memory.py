"""Peak memory (max RSS) of a d_model-64 training step vs depth, with the
`nothing_saveable` remat policy and without remat; each point in a fresh process, and a
straight-line fit RSS = a + b x layers per policy; with freed host memory returned to the
OS (the step's own footprint) and kept for reuse (as the trainer runs it).

  python benchmarks/memory.py [--depths 128,256,512,1024] [--timeout 900]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=wrong-import-position
from depthscale.training import host_memory  # pylint: disable=wrong-import-position

POLICIES = ('none', 'nothing_saveable')


def linear_fit(x: list[int], y: list[float]) -> tuple[float, float, float]:
  """(intercept MiB, slope MiB/layer, largest |residual| / value) of a least-squares line."""
  slope, intercept = np.polyfit(x, y, 1)
  residual = np.abs(np.asarray(y) - (intercept + slope * np.asarray(x))) / np.asarray(y)
  return float(intercept), float(slope), float(residual.max())


def measure(depths: list[int], timeout: float) -> dict:
  """Max RSS (MiB) per (policy, layers), each in a fresh process."""
  rss = {}
  for layers in depths:
    for policy in POLICIES:
      r = common.run_json(['-m', 'benchmarks.deep_model', 'memory', policy, str(layers)], timeout)
      rss[policy, layers] = r.get('max_rss_mib', float('nan'))
      print(f'{policy} {layers} layers: {r} (load {os.getloadavg()[0]:.1f})', flush=True)
  return rss


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--depths', default='128,256,512,1024')
  p.add_argument('--timeout', type=float, default=900)
  a = p.parse_args()
  depths = [int(x) for x in a.depths.split(',')]
  # The step's own footprint (freed memory returned to the OS), then the trainer's process
  # (freed memory kept for reuse once the step is compiled, depthscale.host_memory).
  modes = {'freed memory returned': '1', 'freed memory kept (as the trainer runs)': '0'}
  results = {}
  for mode, opt_out in modes.items():
    os.environ[host_memory.OPT_OUT] = opt_out
    results[mode] = measure(depths, a.timeout)
  for mode, rss in results.items():
    rows = [[layers, *(rss[p, layers] for p in POLICIES),
             rss['nothing_saveable', layers] / rss['none', layers]] for layers in depths]
    print(f'\nmax RSS (MiB) of a process running a train step, {mode}; d_model 64, 2 heads, '
          'seq 128, batch 2')
    print(common.table(['layers', 'no remat', 'nothing_saveable', 'remat / no remat'], rows))
    for policy in POLICIES:
      a0, b, worst = linear_fit(depths, [rss[policy, l] for l in depths])
      print(f'{policy}: RSS = {a0:.0f} MiB + {b:.3f} MiB x layers (largest deviation from the '
            f'line {100 * worst:.1f}%)')


if __name__ == '__main__':
  main()
