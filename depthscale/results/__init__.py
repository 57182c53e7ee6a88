"""Reading and showing results: the ladder loader, text tables, figures, notebook helpers.

`Results` and `load` come from the loader on first use, so that a module importing a
submodule (a rung's process printing its table) does not import pandas and scipy."""

import importlib

__all__ = ['Results', 'load']


def __getattr__(name: str):
  if name in __all__:
    return getattr(importlib.import_module('depthscale.results.loader'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
