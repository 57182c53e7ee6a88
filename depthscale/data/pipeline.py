"""Sharded, resumable grain iterators and the fixed eval set.

Sharding: the global batch of step s holds global records s*B .. s*B + B - 1
(B = data.batch_size) and is sliced into contiguous blocks of b = B / P rows
(P = process_count): row j of process p at step s is global record
s*B + p*b + j. So the processes' batches of a step are disjoint and
concatenate, in process order, to the global batch; with source `mix` every
process gets both tasks. Prepared shards (`array_record`) on several processes are the
exception: each process reads only its slice of the train files, in its own order
(sources.build), so the global batch depends on the process count. With data.workers > 0
the records are read by that many grain worker processes.
"""

from __future__ import annotations

import sys

from absl import flags
import grain
import jax
from ml_collections import ConfigDict
import numpy as np

from depthscale.data import shards
from depthscale.data import sources
from depthscale.errors import ConfigError


def _per_process_batch(cfg: ConfigDict, process_count: int) -> int:
  """data.batch_size // process_count; raises unless it divides evenly."""
  if not isinstance(cfg.batch_size, int) or cfg.batch_size <= 0 or cfg.batch_size % process_count:
    raise ConfigError(f'data.batch_size={cfg.batch_size!r} is invalid: allowed a '
                     f'positive multiple of process_count={process_count}')
  return cfg.batch_size // process_count


def _global_index(m: int, b: int, process_index: int, process_count: int) -> int:
  """The global record index of this process's m-th record."""
  step, row = divmod(m, b)
  return (step * process_count + process_index) * b + row


def validate(cfg: ConfigDict, vocab_size: int, process_count: int | None = None) -> None:
  """Raises ConfigError with a one-line message if `cfg` (data section) is unusable.

  process_count defaults to jax.process_count().
  """
  if not isinstance(cfg.seq_len, int) or cfg.seq_len <= 0:
    raise ConfigError(f'data.seq_len={cfg.seq_len!r} is invalid: allowed a positive int')
  if process_count is None:
    process_count = jax.process_count()
  _per_process_batch(cfg, process_count)
  sources.check(cfg)
  kind, pattern = sources.parse(cfg.source)
  if kind == 'array_record':
    shards.process_files(pattern, 0, process_count)
  if not isinstance(cfg.workers, int) or cfg.workers < 0:
    raise ConfigError(f'data.workers={cfg.workers!r} is invalid: allowed 0 (read in this '
                      'process) or a positive number of grain worker processes')
  need = sources.required_vocab(cfg)
  if vocab_size < need:
    raise ConfigError(f'model.vocab_size={vocab_size!r} is invalid: allowed >= {need} '
                     f'for data.source={cfg.source!r}')


def train_iterator(cfg: ConfigDict, seed: int, process_index: int = 0,
                   process_count: int = 1) -> grain.DatasetIterator:
  """This process's endless stream of training batches; state is JSON-able."""
  b = _per_process_batch(cfg, process_count)
  source = sources.build(cfg, seed, process_index, process_count)
  if source.local:
    record = source.train
  else:
    record = lambda m: source.train(_global_index(m, b, process_index, process_count))
  ds = grain.MapDataset.range(sys.maxsize // process_count).map(record)
  ds = ds.batch(b, drop_remainder=True)
  options = grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=cfg.prefetch)
  ds = ds.to_iter_dataset(options)
  if cfg.workers:
    if not flags.FLAGS.is_parsed():  # grain 0.2.18 reads an absl flag in mp_prefetch
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.workers))
  return iter(ds)


def eval_batches(cfg: ConfigDict, seed: int, num_batches: int, process_index: int = 0,
                 process_count: int = 1) -> list[sources.Example]:
  """This process's share of the fixed held-out eval set, sharded like training."""
  b = _per_process_batch(cfg, process_count)
  source = sources.build(cfg, seed, process_index, process_count)
  batches = []
  for step in range(num_batches):
    rows = [source.eval(_global_index(step * b + j, b, process_index, process_count))
            for j in range(b)]
    batches.append({k: np.stack([r[k] for r in rows]) for k in rows[0]})
  return batches
