"""Tokenizers for text sources: raw bytes, a SentencePiece model or a Hugging Face
`tokenizers` file (tokenizer.json). Tokenizer files are local paths or bucket URLs;
nothing is downloaded. Tokenization is single-threaded: `prepare` parallelizes over
worker processes."""

from __future__ import annotations

import functools
from typing import Protocol

import numpy as np

from depthscale import storage
from depthscale.errors import ConfigError

# End-of-document tokens looked up, in this order, in a tokenizer.json without --eos.
EOS_CANDIDATES = ('<|endoftext|>', '</s>', '<|end_of_text|>', '<eos>', '<|eot_id|>', '[SEP]')


class Tokenizer(Protocol):
  """Maps a document's bytes to token ids."""
  vocab_size: int
  eos_id: int

  def encode(self, data: bytes) -> np.ndarray:
    ...

  def encode_batch(self, docs: list[bytes]) -> list[np.ndarray]:
    ...


class ByteTokenizer:
  """UTF-8 bytes as tokens (vocab 256); EOS is the NUL byte 0."""
  vocab_size = 256
  eos_id = 0

  def encode(self, data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)

  def encode_batch(self, docs: list[bytes]) -> list[np.ndarray]:
    return [self.encode(d) for d in docs]


def _text(data: bytes) -> str:
  return data.decode('utf-8', errors='replace')


class SentencePieceTokenizer:
  """A SentencePiece `.model` file; EOS is the model's eos id."""

  def __init__(self, path: str):
    try:
      import sentencepiece  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ConfigError(f'data.tokenizer={path!r} needs the sentencepiece package '
                       '(pip install sentencepiece); or use byte') from None
    self._sp = sentencepiece.SentencePieceProcessor(model_proto=storage.read_bytes(path))
    self.vocab_size = self._sp.get_piece_size()
    self.eos_id = self._sp.eos_id()
    if self.eos_id < 0:
      raise ConfigError(f'data.tokenizer={path!r} is invalid: allowed a '
                       'SentencePiece model with an eos piece')
    self.eos_token = self._sp.id_to_piece(self.eos_id)
    self._dtype = token_dtype(self.vocab_size)

  def encode(self, data: bytes) -> np.ndarray:
    return self.encode_batch([data])[0]

  def encode_batch(self, docs: list[bytes]) -> list[np.ndarray]:
    ids = self._sp.encode([_text(d) for d in docs], num_threads=1)
    return [np.asarray(i, self._dtype) for i in ids]


def _hf_eos(path: str, tok, eos: str | None) -> int:
  """The EOS id: the --eos token, tokenizer_config.json's eos_token, or a known EOS token."""
  if eos is None:
    config = storage.join(storage.parent(path), 'tokenizer_config.json')
    if storage.exists(config):
      token = storage.read_json(config).get('eos_token')
      eos = token.get('content') if isinstance(token, dict) else token
  for name in (eos,) if eos else EOS_CANDIDATES:
    if tok.token_to_id(name) is not None:
      return tok.token_to_id(name)
  wanted = repr(eos) if eos else 'one of ' + ', '.join(EOS_CANDIDATES) + ' (or name it with --eos)'
  raise ConfigError(f'data.tokenizer={path!r} is invalid: allowed a tokenizer.json holding '
                    f'the eos token {wanted}')


class HuggingFaceTokenizer:
  """A Hugging Face `tokenizers` file (tokenizer.json); no special tokens are added, the
  tokenizer's own EOS goes between documents."""

  def __init__(self, path: str, eos: str | None = None):
    try:
      import tokenizers  # pylint: disable=import-outside-toplevel
    except ImportError:
      raise ConfigError(f'data.tokenizer={path!r} needs the tokenizers package '
                       '(pip install tokenizers); or use byte') from None
    self._tok = tokenizers.Tokenizer.from_str(storage.read_text(path))
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.eos_id = _hf_eos(path, self._tok, eos)
    self.eos_token = self._tok.id_to_token(self.eos_id)
    self._dtype = token_dtype(self.vocab_size)

  def encode(self, data: bytes) -> np.ndarray:
    return self.encode_batch([data])[0]

  def encode_batch(self, docs: list[bytes]) -> list[np.ndarray]:
    out = self._tok.encode_batch_fast([_text(d) for d in docs], add_special_tokens=False)
    return [np.asarray(e.ids, self._dtype) for e in out]


def kind(spec: str) -> str:
  """'byte', 'sentencepiece' or 'tokenizers' for a data.tokenizer / --tokenizer value."""
  if spec == 'byte':
    return 'byte'
  return 'tokenizers' if spec.endswith('.json') or storage.isdir(spec) else 'sentencepiece'


@functools.lru_cache(maxsize=4)
def load(spec: str, eos: str | None = None) -> Tokenizer:
  """The tokenizer of `data.tokenizer`: 'byte', a SentencePiece .model path, or a
  tokenizer.json path (or its directory); eos names a tokenizer.json's EOS token."""
  if spec == 'byte':
    return ByteTokenizer()
  path = storage.join(spec, 'tokenizer.json') if storage.isdir(spec) else spec
  if not storage.isfile(path):
    raise ConfigError(f'data.tokenizer={spec!r} is invalid: allowed byte or the path of an '
                      'existing SentencePiece .model file or tokenizer.json')
  if kind(spec) == 'tokenizers':
    return HuggingFaceTokenizer(path, eos)
  return SentencePieceTokenizer(path)


def token_dtype(vocab_size: int) -> np.dtype:
  """Smallest unsigned dtype that holds every token id."""
  if vocab_size <= 1 << 8:
    return np.dtype(np.uint8)
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
