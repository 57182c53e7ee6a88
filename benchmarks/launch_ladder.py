"""The launcher benchmark's ladder (benchmarks/launch_throughput.py): eight quickstart-size
rungs (d_model 64, T 128, batch 16, 150 steps; depthscale.experiment.small_config), four norm
placements at depths 2 and 4."""

from depthscale.experiment import small_config
from depthscale.ladder import cross, depth_sweep

PLACEMENTS = ('pre_ln', 'post_ln', 'peri_ln', 'sandwich_ln')


def get_config(arg: str | None = None):
  del arg
  return small_config()


def get_ladder(arg: str | None = None):
  del arg
  return cross({p: {'model.block': p} for p in PLACEMENTS}, depth_sweep([2, 4]))
