"""Compile time vs depth (d_model 64): the depthscale step at 8, 64 and 1024 layers (its layer
scan fully unrolled up to model.unroll_max_layers = 16, rolled above), the rolled scan at 8,
and the naive Python-loop JAX step beside them; each in a fresh process.

  python benchmarks/compile_time.py [--scan 8,64,1024] [--rolled 8] [--unrolled 8,64] [--timeout 900]
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
  p.add_argument('--rolled', default='8')
  p.add_argument('--unrolled', default='8,64')
  p.add_argument('--timeout', type=float, default=900)
  a = p.parse_args()
  kinds = (('scan', a.scan), ('rolled', a.rolled), ('unrolled', a.unrolled))
  depths = sorted({int(x) for _, wanted in kinds for x in wanted.split(',')})
  times = {}
  for kind, wanted in kinds:
    for layers in map(int, wanted.split(',')):
      r = common.run_json(['-m', 'benchmarks.deep_model', 'compile', kind, str(layers)], a.timeout)
      times[kind, layers] = r.get('compile_s', float('nan'))
      print(f'{kind} {layers} layers: {r} (load {os.getloadavg()[0]:.1f})', flush=True)
  base = times.get(('scan', 8), float('nan'))
  rows = [[layers, *(times.get((kind, layers), '-') for kind, _ in kinds),
           times[('scan', layers)] / base if ('scan', layers) in times else '-']
          for layers in depths]
  print('\ntrain-step compile time (trace + lower + compile), d_model 64, seconds')
  print(common.table(['layers', 'depthscale (default)', 'rolled scan', 'Python loop',
                      'default / default@8'], rows))


if __name__ == '__main__':
  main()
