"""Compile time vs depth (d_model 64): the scanned depthscale step at 8 and 1024 layers, and
the naive Python-loop JAX step beside it; each in a fresh process.

  python benchmarks/compile_time.py [--scan 8,64,1024] [--unrolled 8,64] [--timeout 900]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # pylint: disable=wrong-import-position


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--scan', default='8,64,1024')
  p.add_argument('--unrolled', default='8,64')
  p.add_argument('--timeout', type=float, default=900)
  a = p.parse_args()
  depths = sorted({int(x) for x in (a.scan + ',' + a.unrolled).split(',')})
  times = {}
  for kind, wanted in (('scan', a.scan), ('unrolled', a.unrolled)):
    for layers in map(int, wanted.split(',')):
      r = common.run_json(['-m', 'benchmarks.deep_model', 'compile', kind, str(layers)], a.timeout)
      times[kind, layers] = r.get('compile_s', float('nan'))
      print(f'{kind} {layers} layers: {r} (load {os.getloadavg()[0]:.1f})', flush=True)
  base = times.get(('scan', 8), float('nan'))
  rows = [[layers, times.get(('scan', layers), '-'), times.get(('unrolled', layers), '-'),
           times[('scan', layers)] / base if ('scan', layers) in times else '-']
          for layers in depths]
  print('\ntrain-step compile time (trace + lower + compile), d_model 64, seconds')
  print(common.table(['layers', 'depthscale (scan)', 'Python loop', 'scan / scan@8'], rows))


if __name__ == '__main__':
  main()
