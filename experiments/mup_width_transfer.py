"""LR sweep x width ladder under standard parametrization and muP (Yang et al. 2022, TP5).

Run:
  python -m depthscale.main --config=experiments/mup_width_transfer.py --workdir=runs/mup_width
  python -m depthscale.main --config=experiments/mup_width_transfer.py:mup ...  (one family)
Coordinate check of the same setup:
  python -m depthscale.coord_check --config=experiments/mup_width_transfer.py:mup \
      --vary=d_model --values=32,64,128,256 --out=runs/coord_mup

Runtime: 2 families x 4 widths (d_model 32, 64, 128, 256 at L 4, head_dim 32) x 5 LRs =
40 rungs, 200 steps, on the synthetic mix, one seed.
Expected result (the muP claim): the loss-minimizing LR stays put across width under muP
(base width 32, where both families are one model), drifts down as width grows under
standard.
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
