"""Write the claims table: python -m depthscale.claims [--runs EXPERIMENT:SIZE=DIR ...]
[--out docs/claims.md] [--note TEXT].

Without --runs it reads the repository's kept records (records/*.json.gz,
depthscale.results.records), each with its note: that is how docs/claims.md is made, so
anyone can regenerate it. Each --runs names a ladder directory instead, with the experiment
file (without .py) and size that made it, e.g. method_survey:cpu=runs/method_survey
('default' for a file run without an argument). Verdicts and measured columns come from
those runs (depthscale.results.claims); claims without a run say 'not measured'."""

from __future__ import annotations

import argparse

from depthscale import storage
from depthscale.results import claims, loader, records


def parse_run(text: str) -> tuple[tuple[str, str], str]:
  """'EXPERIMENT:SIZE=DIR' -> ((EXPERIMENT, SIZE), DIR)."""
  key, sep, path = text.partition('=')
  experiment, colon, size = key.partition(':')
  if not (sep and colon and experiment and size and path):
    raise argparse.ArgumentTypeError(f'--runs={text!r}: allowed EXPERIMENT:SIZE=DIR')
  return (experiment, size), path


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog='python -m depthscale.claims', description=__doc__.splitlines()[0])
  parser.add_argument('--runs', type=parse_run, nargs='*', default=[],
                      help='EXPERIMENT:SIZE=DIR, one per ladder directory (default: records/)')
  parser.add_argument('--out', default='docs/claims.md', help='the markdown file written')
  parser.add_argument('--note', default='', help='said under the runs read, e.g. the machine and its load')
  args = parser.parse_args(argv)
  for _, path in args.runs:
    if not storage.isdir(path):
      parser.exit(2, f'error: --runs directory {path!r} does not exist\n')
  runs, note = dict(args.runs), args.note
  if not runs:
    kept = records.kept()
    if not kept:
      parser.exit(2, f'error: no --runs given and no records in {records.DIR}/ (run from the '
                     'repository root)\n')
    runs = {records.key(path): path for path in kept}
    notes = [records.read(path)[1].rstrip('.') for path in kept] + ([note] if note else [])
    note = '. '.join(dict.fromkeys(notes))
  table = claims.evaluate({key: loader.load(path) for key, path in runs.items()})
  storage.write_text(args.out, claims.markdown(table, note.strip()))
  counts = table.verdict.value_counts()
  print(f'wrote {args.out}: ' + ', '.join(f'{counts.get(v, 0)} {v}' for v in claims.VERDICTS))


if __name__ == '__main__':
  main()
