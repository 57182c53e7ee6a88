"""PNG figures of per-layer metrics and ladders (matplotlib Figure objects, no pyplot state, so
any backend a notebook uses is left alone); a run's own images are training.raster's."""

from __future__ import annotations

import io

import matplotlib
import matplotlib.ticker
from matplotlib.figure import Figure
import numpy as np
import pandas as pd

from depthscale import storage
from depthscale.training.raster import PROFILE_METRICS, relative_depth

LEGEND_MAX = 12  # labelled lines up to which an axes gets a legend


def legend(ax, fontsize: int) -> None:
  """The axes' legend; past LEGEND_MAX labelled lines (a sweep of many variants) the title
  says how many lines there are instead: such a legend is unreadable, and placing it took
  matplotlib minutes per figure."""
  n = len(ax.get_legend_handles_labels()[1])
  if n <= LEGEND_MAX:
    ax.legend(fontsize=fontsize)
  else:
    ax.set_title(f'{ax.get_title()}\n({n} lines, no legend)', fontsize=fontsize + 2)


def png_bytes(fig, dpi: int = 80, **savefig_kwargs) -> bytes:
  """The figure as PNG."""
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=dpi, **savefig_kwargs)
  return buf.getvalue()


def save(fig, path: str, dpi: int = 80, **savefig_kwargs) -> None:
  """Writes the figure as a PNG file (local or bucket path, atomically)."""
  storage.write_bytes(path, png_bytes(fig, dpi, **savefig_kwargs))


def loss_vs_depth(curves: dict[str, tuple[list[int], list[float]]], path: str) -> None:
  """Final eval loss vs num_layers, one line per variant; written to path."""
  fig = Figure(figsize=(5, 3.5))
  ax = fig.subplots()
  for name, (depths, losses) in sorted(curves.items()):
    order = np.argsort(depths)
    ax.plot(np.asarray(depths)[order], np.asarray(losses)[order], marker='o', label=name)
  ax.set_xscale('log', base=2)
  ax.set(xlabel='num_layers L', ylabel='final eval loss', title='loss vs depth')
  legend(ax, 7)
  fig.tight_layout()
  save(fig, path)


def final_profiles(profiles: dict[str, dict[str, list[float]]], path: str,
                   metrics: tuple[str, ...] = PROFILE_METRICS) -> None:
  """Per-layer metrics at the final step vs l/L, one panel per metric, one line per rung."""
  shown = [m for m in metrics if any(m in p for p in profiles.values())]
  cols = min(4, max(len(shown), 1))
  rows = max(1, -(-len(shown) // cols))
  fig = Figure(figsize=(3.2 * cols, 2.6 * rows))
  axes = fig.subplots(rows, cols, squeeze=False)
  for ax, metric in zip(axes.flat, shown):
    for rung, p in sorted(profiles.items()):
      if metric in p:
        v = np.asarray(p[metric], float)
        ok = ~np.isnan(v)
        ax.plot(relative_depth(len(v))[ok], v[ok], marker='.', label=rung)
    ax.set(xlabel='l / L', title=metric)
  for ax in axes.flat[len(shown):]:
    ax.axis('off')
  if shown:
    legend(axes.flat[0], 6)
  fig.tight_layout()
  save(fig, path)


def _errorbar(ax, x, mean, std, **kwargs) -> None:
  """Points with std-over-seeds error bars (none where a point has one seed)."""
  ax.errorbar(x, mean, yerr=np.nan_to_num(np.asarray(std, float)), marker='o', ls='none',
              capsize=3, **kwargs)


def fits_figure(fits, xlabel: str, title: str, base: int = 10) -> Figure:
  """Final eval loss per point (mean +- std over seeds) and each determined fit's curve
  (dashed), one color per results.fits.Fit, log x (to `base`)."""
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for i, f in enumerate(fits):
    form = f.form or 'not determined'
    _errorbar(ax, f.x, f.mean, f.std, color=f'C{i % 10}', label=f'{f.label.split(":")[0]}: {form}')
    if f.determined:
      xx = np.geomspace(f.x.min(), f.x.max(), 100)
      ax.plot(xx, f.predict(xx), color=f'C{i % 10}', ls='--')
  ax.set_xscale('log', base=base)
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set(xlabel=xlabel, ylabel='final eval loss', title=title)
  legend(ax, 6)
  fig.tight_layout()
  return fig


def loss_vs_flops_figure(curves: dict[str, tuple[list[float], list[float]]]) -> Figure:
  """Final eval loss vs training FLOPs, every rung a point, one color per variant, log x."""
  fig = Figure(figsize=(5.5, 3.8))
  ax = fig.subplots()
  for name, (flops, losses) in sorted(curves.items()):
    ax.plot(flops, losses, marker='o', ls='none', label=name)
  ax.set_xscale('log')
  ax.set(xlabel='training FLOPs', ylabel='final eval loss', title='loss vs training compute')
  legend(ax, 7)
  fig.tight_layout()
  return fig


def loss_vs_lr_figure(points: pd.DataFrame, chosen: dict[str, float]) -> Figure:
  """A learning-rate sweep: final eval loss vs rate per variant (Results.rate_points), every
  seed a point, the mean over seeds at each rate a line, the chosen rate a ring; log x."""
  fig = Figure(figsize=(5.5, 3.8))
  ax = fig.subplots()
  for i, (name, g) in enumerate(points.groupby('variant', sort=True)):
    color = f'C{i % 10}'
    ax.plot(g.lr, g.loss, marker='o', ls='none', ms=3, alpha=0.6, color=color)
    means = g.groupby('lr').loss.mean()
    ax.plot(means.index, means.values, color=color, label=name)
    if name in chosen:
      ax.plot([chosen[name]], [means[chosen[name]]], marker='o', ms=11, mfc='none', color=color)
  ax.set_xscale('log')
  ax.set(xlabel='learning rate', ylabel='final eval loss',
         title='learning-rate sweep (ring: the chosen rate)')
  legend(ax, 6)
  fig.tight_layout()
  return fig


def isoflop_figure(groups: list[tuple[str, dict[str, tuple[list, list, list]]]]) -> Figure:
  """Iso-FLOP panels (title, variant -> (depths, mean losses, stds)): loss vs depth at equal
  training compute, one line per variant, log2 x."""
  fig = Figure(figsize=(4.2 * len(groups), 3.6))
  axes = fig.subplots(1, len(groups), squeeze=False)[0]
  for ax, (title, curves) in zip(axes, groups):
    for i, (name, (depths, means, stds)) in enumerate(sorted(curves.items())):
      _errorbar(ax, depths, means, stds, color=f'C{i % 10}', label=name)
      ax.plot(depths, means, color=f'C{i % 10}')
    ax.set_xscale('log', base=2)
    ax.set(xlabel='num_layers L (narrower to the right)', ylabel='final eval loss', title=title)
    legend(ax, 6)
  fig.tight_layout()
  return fig
