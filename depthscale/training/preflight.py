"""The checks of a rung's inputs against this machine (data files, devices); they run
before anything is written, so bad input leaves no directory behind."""

from __future__ import annotations

from depthscale import data
from depthscale.training import sharding


def check_inputs(cfg) -> None:
  """Opens and measures the data source (one window of seq_len + 1 tokens in each split)
  and fits the mesh to the devices; raises ConfigError naming the field."""
  data.measure(cfg.data)
  sharding.check_mesh(cfg)
