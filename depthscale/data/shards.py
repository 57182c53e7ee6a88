"""ArrayRecord shards of fixed-length token chunks, as written by `prepare`.

A directory holds `train-*.array_record`, `eval-*.array_record` and
`meta.json`. A source `array_record:GLOB` reads the files matching GLOB for
training; its eval split is the same glob with the first `train` of the file
name pattern replaced by `eval` (so `DIR/train-*.array_record` pairs with
`DIR/eval-*.array_record`), and its metadata is the `meta.json` next to the
first matched file.
"""

from __future__ import annotations

from depthscale import storage
from depthscale.data import text
from depthscale.errors import ConfigError

META = 'meta.json'


def eval_pattern(pattern: str) -> str:
  """The eval-split glob paired with a train-split glob."""
  head, _, tail = pattern.rpartition('/')
  if 'train' not in tail:
    raise ConfigError(f'data.source=array_record:{pattern!r} is invalid: allowed a '
                     "file pattern containing 'train' (eval is found by "
                     "replacing it with 'eval')")
  return f"{head}{'/' if head else ''}{tail.replace('train', 'eval', 1)}"


def read_meta(pattern: str) -> dict:
  """The meta.json next to the first file matching pattern."""
  path = storage.join(storage.parent(text.expand(pattern)[0]), META)
  if not storage.isfile(path):
    raise ConfigError(f'data.source=array_record:{pattern!r} is invalid: allowed '
                     f'shards with a {META} written by depthscale.data.prepare')
  return storage.read_json(path)


def process_files(pattern: str, process_index: int, process_count: int) -> list[str]:
  """The train files process p reads: every process_count-th file from the p-th (all
  files for one process). Raises unless every process gets at least one."""
  files = text.expand(pattern)
  if len(files) < process_count:
    raise ConfigError(f'data.source=array_record:{pattern!r} is invalid: allowed at least '
                      f'process_count={process_count} train files (each process reads its '
                      f'own; re-run prepare with a smaller --shard_chunks)')
  return files[process_index::process_count]
