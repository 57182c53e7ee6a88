"""A run's TensorBoard images of per-layer metrics, drawn straight into pixels with Pillow: a
layer x step heatmap and an l/L profile in a few ms each (matplotlib's figures took 70-90 ms,
most of it laying out text: a measurable part of a short run's analyses)."""

from __future__ import annotations

import functools
import io

import matplotlib
import numpy as np
from PIL import Image, ImageDraw, ImageFont

PROFILE_METRICS = ('update_ratio', 'attn_contrib', 'mlp_contrib', 'cos_in_out',
                   'angular_distance', 'logit_lens_kl', 'skip_delta_loss',
                   'jacobian_identity_dev')


def relative_depth(num_layers: int) -> np.ndarray:
  """l / L for l = 1..L."""
  return np.arange(1, num_layers + 1) / num_layers


SIZE = (400, 280)  # pixels: the 5 x 3.5 inch figures at 80 dpi they replace
BOX = (46, 22, 330, 244)  # the plot area (left, top, right, bottom); a colorbar right of it
LUT_SIZE = 256


@functools.cache
def font() -> ImageFont.FreeTypeFont:
  return ImageFont.load_default(10)


@functools.cache
def viridis() -> np.ndarray:
  """(LUT_SIZE, 3) uint8 RGB of matplotlib's viridis."""
  return matplotlib.colormaps['viridis'](np.linspace(0, 1, LUT_SIZE), bytes=True)[:, :3]


def colors(x: np.ndarray) -> np.ndarray:
  """viridis RGB of values in [0, 1] (LUT_SIZE bins, as matplotlib picks them)."""
  return viridis()[np.clip((np.asarray(x) * LUT_SIZE).astype(int), 0, LUT_SIZE - 1)]


def unit(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
  """v mapped to [0, 1] from [lo, hi] (0 where lo == hi)."""
  return (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)


def layer_ticks(num_layers: int, most: int = 8) -> np.ndarray:
  """At most `most` 1-based layer indices, evenly spaced, first and last included."""
  return np.unique(np.linspace(1, num_layers, min(num_layers, most)).round().astype(int))


def nice_ticks(lo: float, hi: float, most: int = 5) -> np.ndarray:
  """At most `most` round values (multiples of 1, 2 or 5 times a power of 10) in [lo, hi]."""
  if not hi > lo:
    return np.array([lo])
  for base in 10.0 ** np.floor(np.log10((hi - lo) / most)) * np.array([1, 2, 5, 10, 20]):
    ticks = np.arange(np.ceil(lo / base), np.floor(hi / base) + 1) * base
    if len(ticks) <= most:
      return ticks
  return np.array([lo, hi])


class Canvas:
  """A white image with a framed plot area (BOX); every label drawn is also kept in `texts`
  as (text, x, y) of its anchor, so that what an image says can be checked without OCR."""

  def __init__(self, title: str, xlabel: str, ylabel: str):
    self.image = Image.new('RGB', SIZE, 'white')
    self.draw = ImageDraw.Draw(self.image)
    self.texts: list[tuple[str, float, float]] = []
    left, top, right, bottom = BOX
    self.text(title, (left + right) / 2, 2, 'mt')
    self.text(xlabel, (left + right) / 2, SIZE[1] - 2, 'mb')
    label = Image.new('L', (bottom - top, 12), 255)
    ImageDraw.Draw(label).text(((bottom - top) / 2, 0), ylabel, fill=0, font=font(), anchor='mt')
    self.image.paste(label.rotate(90, expand=True), (0, top))
    self.texts.append((ylabel, 0, (top + bottom) / 2))

  def text(self, s: str, x: float, y: float, anchor: str, fill='black') -> None:
    self.draw.text((x, y), s, fill=fill, font=font(), anchor=anchor)
    self.texts.append((s, x, y))

  def xtick(self, x: float, label: str) -> None:
    self.draw.line([(x, BOX[3]), (x, BOX[3] + 3)], fill='black')
    self.text(label, x, BOX[3] + 4, 'mt')

  def ytick(self, y: float, label: str) -> None:
    self.draw.line([(BOX[0] - 3, y), (BOX[0], y)], fill='black')
    self.text(label, BOX[0] - 5, y, 'rm')

  def png(self) -> bytes:
    self.draw.rectangle(BOX, outline='black')
    buf = io.BytesIO()
    self.image.save(buf, format='png')
    return buf.getvalue()


def layer_rows(num_layers: int, measured: np.ndarray) -> np.ndarray:
  """For each pixel row of the plot area, top first, the 0-based index into `measured` (the
  layers with values, 1-based, ascending) of the layer it shows: layer l spans
  (l - 1/2, l + 1/2) bottom to top, a measured layer fills the band up to halfway to its
  measured neighbours."""
  height = BOX[3] - BOX[1]
  centre = 0.5 + (height - 0.5 - np.arange(height)) / height * num_layers
  return np.searchsorted((measured[1:] + measured[:-1]) / 2, centre)


def heatmap(metric: str, steps: list[int], values_SxL: np.ndarray) -> Canvas:
  """Layer (y, block 1 at the bottom, integer ticks) x logged step (x) heatmap of one metric
  on viridis from its smallest to its largest value (colorbar right); a metric sampled on some
  layers (NaN elsewhere) fills the band up to halfway to its neighbours; NaN cells white."""
  v = np.asarray(values_SxL, float)
  num_layers = v.shape[1]
  c = Canvas(metric, 'step', 'layer')
  has = ~np.all(np.isnan(v), axis=0)
  measured = np.flatnonzero(has if has.any() else ~has) + 1
  shown = v[:, measured - 1]
  lo, hi = (float(np.nanmin(shown)), float(np.nanmax(shown))) if has.any() else (0.0, 0.0)
  left, top, right, bottom = BOX
  column = np.arange(right - left) * len(steps) // (right - left)
  cells = shown.T[layer_rows(num_layers, measured)][:, column]
  rgb = colors(unit(np.nan_to_num(cells, nan=lo), lo, hi))
  rgb[np.isnan(cells)] = 255
  c.image.paste(Image.fromarray(rgb), (left, top))
  for i in np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 6)).astype(int)):
    c.xtick(left + (i + 0.5) * (right - left) / len(steps), str(steps[i]))
  for l in layer_ticks(num_layers):
    c.ytick(bottom - (l - 0.5) * (bottom - top) / num_layers, str(l))
  bar_left = right + 12
  ramp = colors(np.linspace(1, 0, bottom - top))[:, None].repeat(10, axis=1)
  c.image.paste(Image.fromarray(np.ascontiguousarray(ramp)), (bar_left, top))
  c.draw.rectangle((bar_left, top, bar_left + 10, bottom), outline='black')
  c.text(f'{hi:.3g}', bar_left + 13, top, 'lt')
  c.text(f'{lo:.3g}', bar_left + 13, bottom, 'lb')
  return c


def profile(metric: str, steps: list[int], values_SxL: np.ndarray) -> Canvas:
  """Metric (y) vs relative depth l/L (x, 0 to 1), one line per logged step, later steps
  lighter on viridis, a legend of the steps when there are at most 8; a metric sampled on some layers
  (NaN elsewhere): the line joins them."""
  v = np.asarray(values_SxL, float)
  c = Canvas(metric, 'l / L', metric)
  finite = v[np.isfinite(v)]
  lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
  pad = 0.05 * (hi - lo) if hi > lo else max(abs(lo), 1.0) * 0.05
  lo, hi = lo - pad, hi + pad
  left, top, right, bottom = BOX
  to_y = lambda y: bottom - (y - lo) / (hi - lo) * (bottom - top)
  for x in (0.0, 0.25, 0.5, 0.75, 1.0):
    c.xtick(left + x * (right - left), f'{x:g}')
  for y in nice_ticks(lo, hi):
    c.ytick(to_y(y), f'{y + 0.0:.3g}')  # + 0.0: no '-0'
  x = left + relative_depth(v.shape[1]) * (right - left)
  for i, (step, row, rgb) in enumerate(zip(steps, v, colors(np.linspace(0, 1, len(steps))))):
    ok = np.isfinite(row)
    points = list(zip(x[ok], to_y(row[ok])))
    fill = tuple(int(a) for a in rgb)
    if len(points) > 1:
      c.draw.line(points, fill=fill, width=1)
    for px, py in points:
      c.draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=fill)
    if len(steps) <= 8:
      key_y = top + 6 + 12 * i
      c.draw.line([(right + 6, key_y), (right + 16, key_y)], fill=fill, width=2)
      c.text(f'step {step}', right + 19, top + 12 * i, 'lt')
  return c
