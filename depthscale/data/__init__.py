"""Data pipeline: synthetic sources, text corpora, prepared shards and python_docs.

The names below load on first use, so `python -m depthscale.data.prepare` (and its worker
processes) import neither grain nor jax."""

import importlib

_EXPORTS = {'eval_batches': 'pipeline', 'train_iterator': 'pipeline', 'validate': 'pipeline',
            'data_info': 'sources', 'SOURCES': 'sources', 'hop_values': 'sources',
            'required_vocab': 'sources', 'measure': 'sources'}


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return getattr(importlib.import_module(f'depthscale.data.{_EXPORTS[name]}'), name)
