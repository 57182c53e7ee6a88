"""The checks of a rung's inputs against this machine (workdir's store, data files,
devices); they run before anything is written, so bad input leaves no directory behind."""

from __future__ import annotations

from depthscale import data, storage
from depthscale.training import sharding


def check_inputs(cfg, workdir: str | None = None) -> None:
  """Checks a bucket workdir (filesystem package, credentials, bucket), opens and measures
  the data source (one window of seq_len + 1 tokens in each split) and fits the mesh to the
  devices; raises ConfigError naming the field."""
  if workdir is not None:
    storage.check_bucket(workdir, 'workdir')
  data.measure(cfg.data)
  sharding.check_mesh(cfg)
