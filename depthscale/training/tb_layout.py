"""The custom-scalars layout of a rung's per-layer metrics: one chart per metric holding all
its layers (TensorBoard tags `layers/<metric>/<l:04d>`), charts grouped by what they measure."""

from __future__ import annotations

import re
from typing import Iterable

from tensorboard.plugins.custom_scalar import layout_pb2

CATEGORIES = (  # (title, metrics); a metric in none of them goes to 'layers: other'
    ('layers: residual updates', ('update_ratio', 'attn_contrib', 'mlp_contrib', 'attn_cos',
                                  'mlp_cos', 'update_cos', 'cos_in_out')),
    ('layers: depth use (analyses)', ('skip_delta_loss', 'logit_lens_kl', 'logit_lens_top5',
                                      'angular_distance', 'jacobian_identity_dev')),
    ('layers: activations', ('act_rms', 'act_var', 'max_abs_act', 'kurtosis', 'saturation',
                             'erank_acts')),
    ('layers: parameters and gradients', ('grad_norm', 'grad_norm_attn', 'grad_norm_mlp',
                                          'param_norm', 'update_param_ratio', 'param_rotation',
                                          'erank_weights')),
    ('layers: attention', ('attn_entropy_mean', 'attn_entropy_min')),
)


def layer_tag(metric: str, layer: int) -> str:
  """The scalar tag of a metric at 1-based layer `layer`."""
  return f'layers/{metric}/{layer:04d}'


def layer_regex(metric: str) -> str:
  """A regex matching exactly the layer tags of `metric`."""
  return f'^layers/{re.escape(metric)}/[0-9]+$'


def layer_layout(metrics: Iterable[str]) -> layout_pb2.Layout:
  """Categories of multiline charts, one chart per metric over all its layer tags."""
  metrics = set(metrics)
  known = {m for _, group in CATEGORIES for m in group}
  groups = [(title, [m for m in group if m in metrics]) for title, group in CATEGORIES]
  groups.append(('layers: other', sorted(metrics - known)))
  return layout_pb2.Layout(category=[
      layout_pb2.Category(title=title, chart=[
          layout_pb2.Chart(title=m, multiline=layout_pb2.MultilineChartContent(
              tag=[layer_regex(m)])) for m in group])
      for title, group in groups if group])
