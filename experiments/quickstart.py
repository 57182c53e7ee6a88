"""Quickstart: Pre-LN vs Post-LN at two depths on the embedded synthetic data, and Post-LN
at its own best rate.

Run:
  python -m depthscale.main --config=experiments/quickstart.py --workdir=runs/quickstart

Runtime: about 2.5 minutes on a 2-core CPU (5 rungs, d_model 64, 150 steps each).
Expected result (measured): at lr 3e-3 with a 15-step warmup, Pre-LN trains at both
depths (eval loss about 2.48) while Post-LN lags far behind and gets worse with depth
(about 3.43 at L2, 3.72 at L8). The rate is not the cause at this size: Post-LN L8 swept
alone (seed 0) ends at 4.32 at 3e-4, 3.75 at 1e-3, 3.72 at 3e-3, 1e-2 and 3e-2, so its
best rate, 1e-2 (the rung post_ln_L8_lr1e-2, 3.72), leaves it on the same plateau. At
this size and budget Post-LN's deep stack stalls at any rate; with more tokens it need
not (docs/claims.md: each placement at its own rate, 20 tokens per parameter). 150
steps are too few for the k-hop answers (accuracy ~0). The final table compares the
rungs.
"""

from depthscale.experiment import small_config
from depthscale.ladder import Rung, cross, depth_sweep


def get_config(arg: str | None = None):
  del arg
  return small_config()


def get_ladder(arg: str | None = None):
  del arg
  return cross({'pre_ln': {'model.block': 'pre_ln'}, 'post_ln': {'model.block': 'post_ln'}},
               depth_sweep([2, 8])) + [
                   Rung('post_ln_L8_lr1e-2', {'model.block': 'post_ln', 'model.num_layers': 8,
                                              'optim.lr': 1e-2})]
