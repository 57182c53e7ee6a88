"""LR sweep x width ladder under standard parametrization and muP (Yang et al. 2022, TP5).

Run:
  python -m depthscale.main --config=experiments/mup_width_transfer.py --workdir=runs/mup_width
  python -m depthscale.main --config=experiments/mup_width_transfer.py:mup ...  (one family)

Runtime: 2 families x 4 widths (d_model 32, 64, 128, 256 at L 4, head_dim 32) x 5 LRs =
40 rungs, 200 steps of batch 8 x T 64 (102,400 tokens), on the synthetic mix, one seed:
82-273 s each on the 2-core machine with two rungs training at once and other jobs running
(load average 4.1-14.8, mean 11.9, sampled each minute); the whole ladder in 67 minutes.
Expected result (the muP claim): the loss-minimizing LR stays put across width under muP
(base width 32, where both families are one model), drifts down as width grows under
standard. Measured (final eval loss, one seed; the muP row of docs/claims.md): muP's best
rate is 1e-2 at every width (2.497, 2.566, 2.455, 2.468 at d 32, 64, 128, 256); standard's
moves down two grid steps: 1e-2 at d 32 (2.497), 3e-3 at d 64 (2.510) and d 128 (2.511,
with 1e-3 at 2.512), 1e-3 at d 256 (2.425). At d 32 the two families' rungs agree exactly
at every rate. The losses at each family's best rate do not order one way: standard ends
below muP at d 64 and d 256 (2.510 vs 2.566, 2.425 vs 2.468), above it at d 128 (2.511 vs
2.455).
"""

from depthscale.experiment import transfer_config
from depthscale.ladder import Rung, cross

FAMILIES = ('standard', 'mup')
WIDTHS = (32, 64, 128, 256)
LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)
HEAD_DIM = 32


def get_config(arg: str | None = None):
  return transfer_config(arg or 'mup', d_model=WIDTHS[0], num_heads=WIDTHS[0] // HEAD_DIM,
                         num_layers=4, base_d_model=WIDTHS[0])


def get_ladder(arg: str | None = None):
  families = (arg,) if arg else FAMILIES
  rungs = [Rung(f'd{d}_lr{lr:g}', {'model.d_model': d, 'model.num_heads': d // HEAD_DIM,
                                   'optim.lr': lr})
           for d in WIDTHS for lr in LRS]
  return cross({f: {'model.parametrization': f} for f in families}, rungs)
