"""A ladder's kept record: what the claims table and the notebooks read from each rung (its
config, summary, learning-rate choice and JSONL logs; never checkpoints or event files), in
one gzipped JSON file of the repository's records/ directory, named
'<experiment>.<size>.json.gz', with a note on how the runs were made (machine, load).

  python -m depthscale.keep --runs method_survey:tokens20=runs/survey20 --note '...'

writes records/method_survey.tokens20.json.gz. `depthscale.results.load` reads a record as it
reads a ladder directory, and `python -m depthscale.claims` with no --runs regenerates
docs/claims.md from every record (the same bytes)."""

from __future__ import annotations

import gzip
import json

from depthscale import storage, sweep

JSON_FILES = ('config.json', 'summary.json', sweep.CHOICE_FILE)
JSONL_FILES = ('layer_metrics.jsonl', 'train_log.jsonl', 'eval_log.jsonl', 'analysis_log.jsonl')
SUFFIX = '.json.gz'
DIR = 'records'  # the repository's, relative to its root as the other commands' paths are

Rungs = dict[str, dict[str, object]]  # rung -> file name -> its parsed content


def read_ladder(ladder_dir: str) -> Rungs:
  """The kept files of every rung of a ladder directory (those holding a config.json)."""
  rungs = {}
  for rung in storage.listdir(ladder_dir):
    path = lambda f, rung=rung: storage.join(ladder_dir, rung, f)
    if not storage.isfile(path('config.json')):
      continue
    rungs[rung] = {f: storage.read_json(path(f)) for f in JSON_FILES if storage.exists(path(f))}
    rungs[rung].update({f: storage.read_jsonl(path(f)) for f in JSONL_FILES
                        if storage.exists(path(f))})
  return rungs


def is_record(path: str) -> bool:
  return str(path).endswith(SUFFIX)


def name(experiment: str, size: str) -> str:
  return f'{experiment}.{size}{SUFFIX}'


def key(path: str) -> tuple[str, str]:
  """'records/method_survey.tokens20.json.gz' -> ('method_survey', 'tokens20')."""
  experiment, _, size = storage.name(path).removesuffix(SUFFIX).partition('.')
  return experiment, size


def pack(ladder_dir: str, out: str, note: str) -> int:
  """Writes the record of a ladder directory to `out` (the same bytes for the same runs);
  returns its size in bytes."""
  data = json.dumps({'note': note, 'rungs': read_ladder(ladder_dir)},
                    separators=(',', ':')).encode()  # files' own key order; rungs sorted
  packed = gzip.compress(data, compresslevel=9, mtime=0)
  storage.makedirs(storage.parent(out))
  storage.write_bytes(out, packed)
  return len(packed)


def read(path: str) -> tuple[Rungs, str]:
  """(rungs, note) of a record file."""
  data = json.loads(gzip.decompress(storage.read_bytes(path)))
  return data['rungs'], data['note']


def kept(directory: str = DIR) -> list[str]:
  """The record files of a directory, sorted."""
  return [storage.join(directory, f) for f in storage.listdir(directory) if is_record(f)]
