"""Reading and showing results: the ladder loader, text tables, figures, notebook helpers."""

from depthscale.results.loader import Results, load

__all__ = ['Results', 'load']
