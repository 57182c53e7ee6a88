"""A run's TensorBoard images (depthscale.training.raster) show the data: a heatmap cell's
colour is matplotlib's viridis of its value between the smallest and largest, block 1 at the
bottom, layers labelled by their 1-based index at their rows; a profile's points sit at l/L
and at heights linear in the values, one colour per step."""

import io

import matplotlib
import numpy as np
import pytest
from PIL import Image

from depthscale.training import raster

LEFT, TOP, RIGHT, BOTTOM = raster.BOX


def pixels(canvas) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(canvas.png())).convert('RGB'))


def cell(s: int, l: int, num_steps: int, num_layers: int) -> tuple[int, int]:
  """(row, column) of the centre of step index s, 1-based layer l."""
  return (int(BOTTOM - (l - 0.5) * (BOTTOM - TOP) / num_layers),
          int(LEFT + (s + 0.5) * (RIGHT - LEFT) / num_steps))


def viridis(v: np.ndarray) -> np.ndarray:
  norm = matplotlib.colors.Normalize(np.nanmin(v), np.nanmax(v))
  return matplotlib.colormaps['viridis'](norm(v), bytes=True)[..., :3]


def test_heatmap_cells_are_viridis_of_their_values():
  v = np.random.default_rng(0).normal(size=(3, 5))
  img = pixels(raster.heatmap('m', [0, 10, 20], v))
  assert img.shape == raster.SIZE[::-1] + (3,)
  for s in range(3):
    for l in range(1, 6):
      assert np.array_equal(img[cell(s, l, 3, 5)], viridis(v)[s, l - 1]), (s, l)


def test_heatmap_sampled_layers_fill_halfway_and_nan_cells_are_white():
  v = np.full((2, 7), np.nan)
  v[:, [0, 3, 6]] = [[1.0, 2.0, 3.0], [4.0, np.nan, 6.0]]  # layers 1, 4, 7 measured
  img = pixels(raster.heatmap('m', [0, 5], v))
  shown = {1: 1, 2: 1, 3: 4, 4: 4, 5: 4, 6: 7, 7: 7}  # halfway: 2.5 and 5.5
  for l, source in shown.items():
    assert np.array_equal(img[cell(0, l, 2, 7)], viridis(v)[0, source - 1]), l
  assert np.array_equal(img[cell(1, 4, 2, 7)], [255, 255, 255])


@pytest.mark.parametrize('num_layers', [1, 2, 5, 64])
def test_heatmap_labels_layers_by_integer_index_at_their_rows(num_layers):
  steps = [0, 10, 20]
  canvas = raster.heatmap('m', steps, np.random.default_rng(0).normal(size=(3, num_layers)))
  ticks = [(int(s), y) for s, x, y in canvas.texts if x == LEFT - 5]
  labels = [l for l, _ in ticks]
  assert labels == sorted(labels) and labels[0] == 1 and labels[-1] == num_layers
  assert len(labels) == min(num_layers, 8) and len(set(np.diff(labels))) <= 2
  assert all(int(y) == cell(0, l, 3, num_layers)[0] for l, y in ticks)  # tick l at row l
  assert [s for s, x, y in canvas.texts if y == BOTTOM + 4] == ['0', '10', '20']
  assert ('m', (LEFT + RIGHT) / 2, 2) in canvas.texts and 'layer' in [t for t, _, _ in canvas.texts]


def test_profile_points_at_relative_depth_and_linear_heights():
  v = np.array([[0.0, 1.0, 3.0, np.nan], [2.0, 2.0, 2.0, 2.0]])
  canvas = raster.profile('m', [0, 7], v)
  img = pixels(canvas)
  first = raster.colors(np.zeros(1))[0]
  rows = []
  for l in (1, 2, 3):
    x = int(LEFT + l / 4 * (RIGHT - LEFT))
    rows.append(np.flatnonzero(np.all(img[:, x] == first, axis=-1)).mean())
  assert rows[0] > rows[1] > rows[2]  # larger values higher up
  assert abs((rows[0] - rows[1]) * 2 - (rows[1] - rows[2])) <= 1  # heights linear in the values
  x4 = int(RIGHT)  # the NaN point is not drawn in step 0's colour
  assert not np.any(np.all(img[TOP + 1:BOTTOM, x4 - 1] == first, axis=-1))
  assert [t for t, _, _ in canvas.texts if t.startswith('step')] == ['step 0', 'step 7']


def test_nice_ticks_are_round_and_inside():
  ticks = raster.nice_ticks(-0.13, 0.92)
  assert 2 <= len(ticks) <= 5 and ticks.min() >= -0.13 and ticks.max() <= 0.92
  assert np.allclose(ticks / (ticks[1] - ticks[0]), np.round(ticks / (ticks[1] - ticks[0])))
