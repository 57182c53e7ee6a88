"""Keep a ladder's runs in the repository: python -m depthscale.keep --runs
EXPERIMENT:SIZE=DIR [...] --note TEXT [--out_dir records].

Writes records/EXPERIMENT.SIZE.json.gz per ladder directory (depthscale.results.records:
each rung's config, summary, learning-rate choice and logs; no checkpoints), with the note
(machine, load, hours) that docs/claims.md then prints."""

from __future__ import annotations

import argparse

from depthscale import storage
from depthscale.claims import parse_run
from depthscale.results import records


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog='python -m depthscale.keep', description=__doc__.splitlines()[0])
  parser.add_argument('--runs', type=parse_run, nargs='+', required=True,
                      help='EXPERIMENT:SIZE=DIR, one per ladder directory')
  parser.add_argument('--note', required=True, help='how the runs were made: machine, load, hours')
  parser.add_argument('--out_dir', default=records.DIR, help='where the records go')
  args = parser.parse_args(argv)
  for _, path in args.runs:
    if not storage.isdir(path):
      parser.exit(2, f'error: --runs directory {path!r} does not exist\n')
  for (experiment, size), path in args.runs:
    out = storage.join(args.out_dir, records.name(experiment, size))
    print(f'wrote {out}: {records.pack(path, out, args.note):,} bytes')


if __name__ == '__main__':
  main()
