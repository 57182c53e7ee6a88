"""The safetensors file format, read and written with numpy (no torch): an 8-byte
little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin,
end]}, '__metadata__': {...}} (offsets into the byte buffer that follows), then the raw
little-endian tensor bytes. Files are memory-mapped: a tensor is read when asked for."""

from __future__ import annotations

import json
import os
from typing import Iterable

import ml_dtypes
import numpy as np

DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16,
          'I64': np.int64, 'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8,
          'BOOL': np.bool_}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
EXPORT_DTYPES = {'float32': 'F32', 'bfloat16': 'BF16'}  # what a depthscale model is written in


class File:
  """One .safetensors file: its tensor names, shapes and dtypes, and the tensors as
  read-only views of the memory-mapped file."""

  def __init__(self, path: str):
    self.path = path
    with open(path, 'rb') as f:
      n = int.from_bytes(f.read(8), 'little')
      header = json.loads(f.read(n))
    self.metadata = header.pop('__metadata__', {}) or {}
    self.header = header
    self._data = np.memmap(path, np.uint8, 'r', offset=8 + n) if header else None

  def names(self) -> list[str]:
    return list(self.header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.header[name]['shape'])

  def dtype(self, name: str) -> str:
    return self.header[name]['dtype']

  def tensor(self, name: str) -> np.ndarray:
    entry = self.header[name]
    begin, end = entry['data_offsets']
    return self._data[begin:end].view(DTYPES[entry['dtype']]).reshape(entry['shape'])


def write(path: str, tensors: Iterable[tuple[str, np.ndarray]], metadata: dict | None = None,
          size_hint: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> None:
  """Writes (name, array) pairs to a .safetensors file. With size_hint ({name: (shape,
  dtype)}, in the order the pairs come) the header is written first and the arrays are
  consumed one at a time (tensors may then be a generator: one tensor in memory at once)."""
  if size_hint is None:
    tensors = list(tensors)
    size_hint = {k: (v.shape, v.dtype) for k, v in tensors}
  header, offset = {}, 0
  for name, (shape, dtype) in size_hint.items():
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    header[name] = {'dtype': NAMES[np.dtype(dtype)], 'shape': list(shape),
                    'data_offsets': [offset, offset + size]}
    offset += size
  header['__metadata__'] = metadata or {}
  raw = json.dumps(header, separators=(',', ':')).encode()
  raw += b' ' * (-len(raw) % 8)  # the data starts 8-byte aligned
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    f.write(len(raw).to_bytes(8, 'little'))
    f.write(raw)
    for (name, array), (want, (shape, dtype)) in zip(tensors, size_hint.items()):
      array = np.asarray(array)
      if name != want or array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
        raise ValueError(f'tensor {name} {array.shape} {array.dtype}: expected {want} {shape} '
                         f'{np.dtype(dtype)}')
      f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)  # little-endian hosts
  os.replace(tmp, path)
