"""Text corpora: files -> one token stream -> held-out tail -> fixed windows."""

from __future__ import annotations

import functools

import numpy as np

from depthscale import storage
from depthscale.data import tokenizer as tokenizer_lib
from depthscale.errors import ConfigError


def expand(pattern: str) -> list[str]:
  """Sorted files matching a glob (local: `**` recurses; or a bucket); raises if there are
  none."""
  paths = [p for p in storage.glob(pattern) if storage.isfile(p)]
  if not paths:
    raise ConfigError(f'data.source glob {pattern!r} is invalid: allowed a glob '
                     'that matches at least one file')
  return paths


def concat(docs: list[bytes], tok: tokenizer_lib.Tokenizer) -> np.ndarray:
  """One token stream of the documents, each followed by EOS."""
  eos = np.asarray([tok.eos_id])
  parts = [eos[:0]]
  for ids in tok.encode_batch(docs):
    parts += [ids, eos]
  return np.concatenate(parts).astype(tokenizer_lib.token_dtype(tok.vocab_size))


def stream(paths: list[str], tok: tokenizer_lib.Tokenizer) -> np.ndarray:
  """Concatenates the documents (one per file), each followed by EOS."""
  return concat([storage.read_bytes(path) for path in paths], tok)


def split(tokens: np.ndarray, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
  """Splits a stream into (train, eval); eval is its last eval_fraction."""
  cut = len(tokens) - int(round(len(tokens) * eval_fraction))
  return tokens[:cut], tokens[cut:]


@functools.lru_cache(maxsize=2)
def corpus(pattern: str, tokenizer: str, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
  """The (train, eval) token streams of a text glob (cached)."""
  return split(stream(expand(pattern), tokenizer_lib.load(tokenizer)), eval_fraction)


class Windows:
  """Non-overlapping windows of `length` tokens of a stream (tail dropped)."""

  def __init__(self, tokens: np.ndarray, length: int):
    self._tokens, self._length = tokens, length

  def __len__(self) -> int:
    return len(self._tokens) // self._length

  def __getitem__(self, i: int) -> np.ndarray:
    return self._tokens[i * self._length:(i + 1) * self._length]
