"""Quickstart: Pre-LN vs Post-LN at two depths on the embedded synthetic data.

Run:
  python -m depthscale.main --config=experiments/quickstart.py --workdir=runs/quickstart

Runtime: about 2 minutes on a 2-core CPU (4 rungs, d_model 64, 150 steps each).
Expected result (measured): at lr 3e-3 with a 15-step warmup, Pre-LN trains at both
depths (eval loss about 2.48) while Post-LN lags far behind and gets worse with depth
(about 3.43 at L2, 3.72 at L8): the Post-LN instability that the norm-placement
literature starts from. 150 steps are too few for the k-hop answers (accuracy ~0). The
final table compares the rungs.
"""

from depthscale.experiment import small_config
from depthscale.ladder import cross, depth_sweep


def get_config(arg: str | None = None):
  del arg
  return small_config()


def get_ladder(arg: str | None = None):
  del arg
  return cross({'pre_ln': {'model.block': 'pre_ln'}, 'post_ln': {'model.block': 'post_ln'}},
               depth_sweep([2, 8]))
