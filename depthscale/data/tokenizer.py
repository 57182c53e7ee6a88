"""Tokenizers for text sources: raw bytes or a SentencePiece model."""

from __future__ import annotations

import functools
import os
from typing import Protocol

import numpy as np

from depthscale.errors import ConfigError


class Tokenizer(Protocol):
  """Maps a document's bytes to token ids."""
  vocab_size: int
  eos_id: int

  def encode(self, data: bytes) -> np.ndarray:
    ...


class ByteTokenizer:
  """UTF-8 bytes as tokens (vocab 256); EOS is the NUL byte 0."""
  vocab_size = 256
  eos_id = 0

  def encode(self, data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


class SentencePieceTokenizer:
  """A SentencePiece `.model` file; EOS is the model's eos id."""

  def __init__(self, path: str):
    try:
      import sentencepiece  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ConfigError(f'data.tokenizer={path!r} needs the sentencepiece package '
                       '(pip install sentencepiece); or use byte') from None
    self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
    self.vocab_size = self._sp.get_piece_size()
    self.eos_id = self._sp.eos_id()
    if self.eos_id < 0:
      raise ConfigError(f'data.tokenizer={path!r} is invalid: allowed a '
                       'SentencePiece model with an eos piece')

  def encode(self, data: bytes) -> np.ndarray:
    return np.asarray(self._sp.encode(data.decode('utf-8', errors='replace')),
                      token_dtype(self.vocab_size))


@functools.lru_cache(maxsize=4)
def load(spec: str) -> Tokenizer:
  """Returns the tokenizer for `data.tokenizer` ('byte' or a .model path)."""
  if spec == 'byte':
    return ByteTokenizer()
  if not os.path.isfile(os.path.expanduser(spec)):
    raise ConfigError(f'data.tokenizer={spec!r} is invalid: allowed byte or the '
                     'path of an existing SentencePiece .model file')
  return SentencePieceTokenizer(os.path.expanduser(spec))


def token_dtype(vocab_size: int) -> np.dtype:
  """Smallest unsigned dtype that holds every token id."""
  if vocab_size <= 1 << 8:
    return np.dtype(np.uint8)
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
