"""Documents of corpus files, streamed: JSONL (.gz, .zst), Parquet, Arrow (a Hugging Face
`datasets` save_to_disk directory) or plain text (one document per file); local or bucket
paths through etils.epath. Plus the held-out split by document hash."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from typing import Iterator

from etils import epath

from depthscale import storage
from depthscale.errors import ConfigError

_BATCH = 1024  # rows per Parquet / Arrow record batch read


def _hf_files(root: epath.Path) -> list[epath.Path]:
  """The arrow files of a `datasets` save_to_disk directory (a DatasetDict: its train split)."""
  if (root / 'dataset_dict.json').exists():
    splits = json.loads((root / 'dataset_dict.json').read_text())['splits']
    root = root / ('train' if 'train' in splits else splits[0])
  state = json.loads((root / 'state.json').read_text())
  return [root / f['filename'] for f in state['_data_files']]


def _is_hf_dir(path: epath.Path) -> bool:
  return path.is_dir() and any((path / n).exists() for n in ('state.json', 'dataset_dict.json'))


def expand(pattern: str, field: str = 'data.source') -> list[str]:
  """Sorted files matching a glob (local: `**` recurses; bucket paths too); a `datasets`
  save_to_disk directory expands to its arrow files. Raises if nothing matches."""
  paths = []
  for p in map(epath.Path, storage.glob(pattern)):
    if _is_hf_dir(p):
      paths += _hf_files(p)
    elif p.is_file():
      paths.append(p)
  if not paths:
    raise ConfigError(f'{field} glob {pattern!r} is invalid: allowed a glob that matches at '
                      'least one file')
  return [os.fspath(p) for p in paths]


def file_format(path: str) -> str:
  """The format of a corpus file, from its name (.json files are read as JSON Lines)."""
  name = storage.name(path).lower()
  for ext in ('jsonl.gz', 'jsonl.zst', 'json.gz', 'json.zst', 'jsonl', 'json', 'parquet', 'arrow'):
    if name.endswith('.' + ext):
      return 'jsonl' if ext == 'json' else ext.replace('json.', 'jsonl.')
  return 'text'


def _lines(path: str, fmt: str) -> Iterator[bytes]:
  with storage.open_file(path) as raw:
    if fmt == 'jsonl.gz':
      f = gzip.GzipFile(fileobj=raw)
    elif fmt == 'jsonl.zst':
      import zstandard  # pylint: disable=import-outside-toplevel
      f = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
    else:
      f = raw
    yield from f


def _field(row: dict, field: str, path: str):
  if field not in row:
    raise ConfigError(f'--text_field={field!r} is invalid: allowed a field of the records '
                      f'of {path} ({", ".join(sorted(row))})')
  return row[field]


def _arrow_batches(path: str, fmt: str, field: str):
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  with storage.open_file(path) as f:
    if fmt == 'parquet':
      pf = pq.ParquetFile(f)
      if field not in pf.schema_arrow.names:
        _field(dict.fromkeys(pf.schema_arrow.names), field, path)
      yield from pf.iter_batches(batch_size=_BATCH, columns=[field])
      return
    # An Arrow IPC stream, as `datasets` writes it: memory-mapped when local.
    local = not storage.is_url(path)
    reader = pa.ipc.open_stream(pa.memory_map(path) if local else pa.py_buffer(f.read()))
    if field not in reader.schema.names:
      _field(dict.fromkeys(reader.schema.names), field, path)
    for batch in reader:
      yield batch.select([field])


def read(path: str, text_field: str = 'text') -> Iterator[bytes]:
  """The UTF-8 documents of one corpus file, in file order (empty ones skipped)."""
  fmt = file_format(path)
  if fmt == 'text':
    yield epath.Path(path).read_bytes()
  elif fmt in ('parquet', 'arrow'):
    for batch in _arrow_batches(path, fmt, text_field):
      for text in batch.column(0).to_pylist():
        if text:
          yield text.encode('utf-8')
  else:
    for line in _lines(path, fmt):
      if line.strip():
        text = _field(json.loads(line), text_field, path)
        if text:
          yield text.encode('utf-8')


def held_out(doc: bytes, eval_fraction: float) -> bool:
  """Whether a document belongs to the held-out split: its hash (BLAKE2b, 64 bits) as a
  uniform number in [0, 1) is below eval_fraction. Duplicates share a split."""
  h = int.from_bytes(hashlib.blake2b(doc, digest_size=8).digest(), 'big')
  return h < eval_fraction * 2.0 ** 64
