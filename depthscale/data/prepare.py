"""Converts corpus files into ArrayRecord token-chunk shards: streaming, parallel, resumable.

  python -m depthscale.data.prepare --input=GLOB --output=DIR \\
      [--tokenizer=byte|PATH.model|PATH/tokenizer.json] [--eos=TOKEN] [--text_field=text] \\
      [--workers=N] [--chunk_tokens=N] [--shard_chunks=N] [--eval_fraction=F]

Inputs (by file name): JSONL, .jsonl.gz, .jsonl.zst, Parquet (the --text_field column),
the arrow files of a Hugging Face `datasets` save_to_disk directory (give the directory),
and any other file as plain text, one document per file. Local or bucket paths
(etils.epath) for input and output. Each document is tokenized, followed by the
tokenizer's EOS, and goes to the held-out split when its hash says so (see
documents.held_out: deterministic, independent of file order and worker count).

Each input file is one job of a pool of --workers processes, with constant memory: its
documents stream into records of --chunk_tokens tokens, --shard_chunks records per file
DIR/{train,eval}-<file index>-<part>.array_record (written to a temporary name, then
renamed). A finished input file is recorded under DIR/.prepare/ and skipped when the
command is run again. At the end the tails of all files (fewer than chunk_tokens tokens
each) are concatenated into DIR/{train,eval}-rest-*.array_record, and DIR/meta.json
holds vocab_size, eos_id, chunk_tokens, dtype and the counts. Read the shards with
`data.source = 'array_record:DIR/train-*.array_record'` and model.vocab_size >= the
meta.json vocab_size.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import sys
import threading
import time
from typing import Sequence

from array_record.python.array_record_module import ArrayRecordWriter
from etils import epath
import numpy as np

from depthscale import storage
from depthscale.data import documents
from depthscale.data import shards
from depthscale.data import tokenizer as tokenizer_lib
from depthscale.errors import ConfigError

SPLITS = ('train', 'eval')
STATE = '.prepare'  # per-input-file completion records and tails
_ENCODE_BATCH = 256  # documents per tokenizer call
_WORKER: dict = {}  # this process's tokenizer, settings and shared counters


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog='python -m depthscale.data.prepare',
                              description=__doc__.split('\n')[0])
  p.add_argument('--input', required=True, help='glob of corpus files (or a datasets directory)')
  p.add_argument('--output', required=True, help='output directory (local or bucket path)')
  p.add_argument('--tokenizer', default='byte',
                 help="'byte', a SentencePiece .model path or a tokenizer.json path")
  p.add_argument('--eos', default=None, help="tokenizer.json's EOS token (default: found in it)")
  p.add_argument('--text_field', default='text', help='JSONL / Parquet / Arrow text field')
  p.add_argument('--workers', type=int, default=1, help='worker processes (one input file each)')
  p.add_argument('--chunk_tokens', type=int, default=8192, help='tokens per record')
  p.add_argument('--eval_fraction', type=float, default=0.05,
                 help='held-out fraction of the documents (by document hash)')
  p.add_argument('--shard_chunks', type=int, default=1024, help='records per shard file')
  p.add_argument('--progress_every', type=float, default=10.0, help='seconds between progress lines')
  return p


class _SplitWriter:
  """Streams token arrays into fixed-length records, shard_chunks records per shard file."""

  def __init__(self, out: epath.Path, stem: str, chunk_tokens: int, shard_chunks: int):
    self.out, self.stem, self.chunk, self.per_shard = out, stem, chunk_tokens, shard_chunks
    self.buf, self.pending = [], 0
    self.writer, self.local, self.in_shard = None, '', 0
    self.shards, self.tokens, self.chunks, self.documents = [], 0, 0, 0

  def add(self, ids: np.ndarray) -> None:
    self.buf.append(ids)
    self.pending += len(ids)
    self.tokens += len(ids)
    self.documents += 1
    if self.pending >= self.chunk:
      self._drain()

  def _drain(self) -> None:
    flat = np.concatenate(self.buf)
    k = len(flat) // self.chunk
    for row in flat[:k * self.chunk].reshape(k, self.chunk):
      self._write(row)
    self.buf, self.pending = [flat[k * self.chunk:]], len(flat) - k * self.chunk

  def _name(self) -> str:
    return f'{self.stem}-{len(self.shards):05d}.array_record'

  def _write(self, row: np.ndarray) -> None:
    if self.writer is None:
      self.local = storage.staging(self.out / self._name())
      self.writer = ArrayRecordWriter(self.local, 'group_size:1')
    self.writer.write(row.tobytes())
    self.in_shard += 1
    self.chunks += 1
    if self.in_shard == self.per_shard:
      self._close_shard()

  def _close_shard(self) -> None:
    if self.writer is not None:
      self.writer.close()
      storage.publish(self.local, self.out / self._name())
      self.shards.append(self._name())
      self.writer, self.in_shard = None, 0

  def close(self) -> np.ndarray:
    """Publishes the open shard; returns the tail (fewer than chunk_tokens tokens)."""
    if self.pending >= self.chunk:
      self._drain()
    self._close_shard()
    return np.concatenate(self.buf) if self.buf else np.zeros(0)


def _init_worker(settings: dict, counters) -> None:
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'  # one core per worker
  _WORKER.update(tok=tokenizer_lib.load(settings['tokenizer'], settings['eos']),
                 settings=settings, counters=counters)


def _convert(job: tuple[int, str]) -> dict:
  """Tokenizes one input file into its shards and tail; records it as finished."""
  index, path = job
  tok, s, (docs_done, tokens_done) = _WORKER['tok'], _WORKER['settings'], _WORKER['counters']
  out = epath.Path(s['output'])
  dtype = tokenizer_lib.token_dtype(tok.vocab_size)
  eos = np.asarray([tok.eos_id], dtype)
  writers = {split: _SplitWriter(out, f'{split}-{index:05d}', s['chunk_tokens'], s['shard_chunks'])
             for split in SPLITS}
  batch = []

  def flush():
    tokens = 0
    for doc, ids in zip(batch, tok.encode_batch(batch)):
      split = 'eval' if documents.held_out(doc, s['eval_fraction']) else 'train'
      writers[split].add(np.concatenate([ids.astype(dtype), eos]))
      tokens += len(ids) + 1
    with docs_done.get_lock():
      docs_done.value += len(batch)
    with tokens_done.get_lock():
      tokens_done.value += tokens
    batch.clear()

  for doc in documents.read(path, s['text_field']):
    batch.append(doc)
    if len(batch) == _ENCODE_BATCH:
      flush()
  flush()
  record = {'index': index, 'input': path}
  for split, w in writers.items():
    tail = w.close()
    buf = io.BytesIO()
    np.save(buf, tail.astype(dtype))
    storage.write_bytes(out / STATE / f'tail-{index:05d}-{split}.npy', buf.getvalue())
    record[split] = {'documents': w.documents, 'tokens': w.tokens, 'chunks': w.chunks,
                     'shards': w.shards}
  storage.write_json(out / STATE / f'done-{index:05d}.json', record, indent=2)
  return record


def _finished(out: epath.Path, index: int, path: str) -> dict | None:
  marker = out / STATE / f'done-{index:05d}.json'
  if marker.exists():
    record = json.loads(marker.read_text())
    if record['input'] == path:
      return record
  return None


def _progress(counters, total_files: int, done: list, every: float, stop: threading.Event):
  """Prints documents, tokens and throughput every `every` seconds until stop is set."""
  t0 = time.perf_counter()
  def line():
    dt = max(time.perf_counter() - t0, 1e-9)
    docs, toks = counters[0].value, counters[1].value
    print(f'prepare: files {len(done)}/{total_files} | docs {docs:,} | tokens {toks:,} | '
          f'{toks / dt:,.0f} tok/s | {docs / dt:,.0f} docs/s | {dt:,.0f} s', file=sys.stderr,
          flush=True)
  while not stop.wait(every):
    line()
  line()


def _run_jobs(jobs: list[tuple[int, str]], settings: dict, workers: int, done: list,
              every: float) -> None:
  ctx = multiprocessing.get_context('spawn')
  counters = (ctx.Value('q', 0), ctx.Value('q', 0))
  stop = threading.Event()
  printer = threading.Thread(target=_progress, args=(counters, len(jobs) + len(done), done,
                                                     every, stop), daemon=True)
  printer.start()
  try:
    if workers == 1 or len(jobs) <= 1:
      _init_worker(settings, counters)
      done.extend(_convert(j) for j in jobs)
    else:
      with ctx.Pool(min(workers, len(jobs)), _init_worker, (settings, counters)) as pool:
        for record in pool.imap_unordered(_convert, jobs):
          done.append(record)
  finally:
    stop.set()
    printer.join()


def _file_sha256(spec: str) -> str:
  if spec == 'byte':
    return ''
  path = epath.Path(spec)
  path = path / 'tokenizer.json' if path.is_dir() else path
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _settings(args, tok: tokenizer_lib.Tokenizer) -> dict:
  return {'output': args.output, 'tokenizer': args.tokenizer, 'eos': args.eos,
          'text_field': args.text_field, 'chunk_tokens': args.chunk_tokens,
          'shard_chunks': args.shard_chunks, 'eval_fraction': args.eval_fraction,
          'vocab_size': tok.vocab_size, 'eos_id': tok.eos_id,
          'tokenizer_sha256': _file_sha256(args.tokenizer)}


def _check_settings(out: epath.Path, settings: dict) -> None:
  """Records the settings of a new output; refuses to resume one made with others."""
  path = out / STATE / 'settings.json'
  if path.exists():
    old = json.loads(path.read_text())
    diff = sorted(k for k in settings if k != 'output' and old.get(k) != settings[k])
    if diff:
      raise SystemExit(f'--output={os.fspath(out)!r} holds shards prepared with other '
                       f'{", ".join(diff)}; use a new --output')
  else:
    storage.write_json(path, settings, indent=2)


def _finish(out: epath.Path, records: list[dict], settings: dict, dtype: np.dtype) -> dict:
  """Writes the concatenated tails of all files and meta.json; returns the metadata."""
  meta = {'vocab_size': settings['vocab_size'], 'tokenizer': settings['tokenizer'],
          'tokenizer_sha256': settings['tokenizer_sha256'], 'eos_id': settings['eos_id'],
          'chunk_tokens': settings['chunk_tokens'], 'dtype': dtype.name,
          'eval_fraction': settings['eval_fraction'], 'split': 'document_hash',
          'text_field': settings['text_field'], 'inputs': len(records)}
  for split in SPLITS:
    for stale in out.glob(f'{split}-rest-*.array_record'):
      stale.unlink()
    rest = _SplitWriter(out, f'{split}-rest', settings['chunk_tokens'], settings['shard_chunks'])
    for r in records:
      tail = storage.read_bytes(out / STATE / f'tail-{r["index"]:05d}-{split}.npy')
      rest.add(np.load(io.BytesIO(tail)))
    rest.close()
    meta[f'{split}_chunks'] = sum(r[split]['chunks'] for r in records) + rest.chunks
    meta[f'{split}_documents'] = sum(r[split]['documents'] for r in records)
    meta[f'{split}_tokens'] = sum(r[split]['tokens'] for r in records)
    if not meta[f'{split}_chunks']:
      raise SystemExit(f'the {split} split has {meta[f"{split}_tokens"]} tokens, fewer than '
                       f'--chunk_tokens={settings["chunk_tokens"]}')
  storage.write_json(out / shards.META, meta, indent=2)
  return meta


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs (or resumes) the conversion; returns the metadata written to meta.json."""
  args = _parser().parse_args(argv)
  if (args.chunk_tokens < 2 or args.shard_chunks < 1 or not 0 < args.eval_fraction < 1
      or args.workers < 1):
    raise SystemExit('--chunk_tokens >= 2, --shard_chunks >= 1, 0 < --eval_fraction < 1 and '
                     '--workers >= 1 required')
  try:
    tok = tokenizer_lib.load(args.tokenizer, args.eos)
    inputs = documents.expand(args.input, '--input')
  except ConfigError as e:
    raise SystemExit(str(e)) from None
  out = epath.Path(args.output)
  (out / STATE).mkdir(parents=True, exist_ok=True)
  settings = _settings(args, tok)
  _check_settings(out, settings)
  done, jobs = [], []
  for index, path in enumerate(inputs):
    record = _finished(out, index, path)
    if record is None:
      for stale in out.glob(f'*-{index:05d}-*.array_record'):
        stale.unlink()
      jobs.append((index, path))
    else:
      done.append(record)
  if done:
    print(f'prepare: {len(done)} of {len(inputs)} input files already done, skipped',
          file=sys.stderr)
  _run_jobs(jobs, settings, args.workers, done, args.progress_every)
  records = sorted(done, key=lambda r: r['index'])
  meta = _finish(out, records, settings, tokenizer_lib.token_dtype(tok.vocab_size))
  print(json.dumps(meta))
  return meta


if __name__ == '__main__':
  main()
