"""PNG figures of per-layer metrics: heatmaps, profiles, ladders (matplotlib Figure objects,
no pyplot state, so any backend a notebook uses is left alone)."""

from __future__ import annotations

import io

import matplotlib
from matplotlib.figure import Figure
import numpy as np

from depthscale import storage

PROFILE_METRICS = ('update_ratio', 'attn_contrib', 'mlp_contrib', 'cos_in_out',
                   'angular_distance', 'logit_lens_kl', 'skip_delta_loss',
                   'jacobian_identity_dev')


def png_bytes(fig, dpi: int = 80, **savefig_kwargs) -> bytes:
  """The figure as PNG."""
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=dpi, **savefig_kwargs)
  return buf.getvalue()


def save(fig, path: str, dpi: int = 80, **savefig_kwargs) -> None:
  """Writes the figure as a PNG file (local or bucket path, atomically)."""
  storage.write_bytes(path, png_bytes(fig, dpi, **savefig_kwargs))


def _png(fig) -> tuple[bytes, int, int]:
  """(PNG bytes, height, width) of a figure."""
  w, h = (int(v) for v in fig.get_size_inches() * 80)
  return png_bytes(fig), h, w


def relative_depth(num_layers: int) -> np.ndarray:
  """l / L for l = 1..L."""
  return np.arange(1, num_layers + 1) / num_layers


def heatmap(metric: str, steps: list[int], values_SxL: np.ndarray) -> tuple[bytes, int, int]:
  """Layer (y, block 1 at the bottom) x logged step (x) heatmap of one metric; a metric
  sampled on some layers (NaN elsewhere) fills the band up to halfway to its neighbours."""
  fig = Figure(figsize=(5, 3.5))
  ax = fig.subplots()
  v = np.asarray(values_SxL, float)
  has = ~np.all(np.isnan(v), axis=0)
  layers = np.flatnonzero(has if has.any() else ~has) + 1.0
  edges = np.concatenate([[0.5], (layers[1:] + layers[:-1]) / 2, [v.shape[1] + 0.5]])
  im = ax.pcolormesh(np.arange(len(steps) + 1) - 0.5, edges, v[:, layers.astype(int) - 1].T,
                     cmap='viridis')
  ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 6)).astype(int))
  ax.set_xticks(ticks, [str(steps[i]) for i in ticks])
  ax.set(xlabel='step', ylabel='layer', title=metric)
  fig.colorbar(im, ax=ax)
  fig.tight_layout()
  return _png(fig)


def profile(metric: str, steps: list[int], values_SxL: np.ndarray) -> tuple[bytes, int, int]:
  """Metric vs relative depth l/L, one line per logged step (darker = later)."""
  fig = Figure(figsize=(5, 3.5))
  ax = fig.subplots()
  colors = matplotlib.colormaps['viridis'](np.linspace(0, 1, len(steps)))
  x = relative_depth(values_SxL.shape[1])
  for step, row, c in zip(steps, np.asarray(values_SxL, float), colors):
    ok = ~np.isnan(row)  # a metric sampled on some layers: the line joins them
    ax.plot(x[ok], row[ok], color=c, marker='.', label=f'step {step}')
  ax.set(xlabel='l / L', ylabel=metric, title=metric)
  if len(steps) <= 8:
    ax.legend(fontsize=6)
  fig.tight_layout()
  return _png(fig)


def loss_vs_depth(curves: dict[str, tuple[list[int], list[float]]], path: str) -> None:
  """Final eval loss vs num_layers, one line per variant; written to path."""
  fig = Figure(figsize=(5, 3.5))
  ax = fig.subplots()
  for name, (depths, losses) in sorted(curves.items()):
    order = np.argsort(depths)
    ax.plot(np.asarray(depths)[order], np.asarray(losses)[order], marker='o', label=name)
  ax.set_xscale('log', base=2)
  ax.set(xlabel='num_layers L', ylabel='final eval loss', title='loss vs depth')
  ax.legend(fontsize=7)
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
  axes.flat[0].legend(fontsize=6)
  fig.tight_layout()
  save(fig, path)
