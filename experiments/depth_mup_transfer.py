"""LR sweep x depth ladder under standard, depth-muP and CompleteP (Dey et al. 2025).

Run:
  python -m depthscale.main --config=experiments/depth_mup_transfer.py --workdir=runs/dmt
  python -m depthscale.main --config=experiments/depth_mup_transfer.py:completep ...  (one family)
Coordinate check of the same setup (about 1 minute per family on a 2-core CPU):
  python -m depthscale.coord_check --config=experiments/depth_mup_transfer.py:completep \
      --vary=num_layers --out=runs/coord_completep

Runtime: 3 families x 4 depths (2, 4, 8, 16) x 4 LRs = 48 rungs of d_model 64, 200 steps,
on the synthetic mix, one seed: 49-257 s each (L 16 the slowest) on the 2-core machine with
two rungs training at once and other jobs running (the last 37 rungs: load average 5.3-11.2).
Expected result (the CompleteP claim): the loss-minimizing LR stays put across depth under
CompleteP (base depth 2), drifts under standard. Measured (final eval loss, one seed; the
transfer rows of docs/claims.md): CompleteP's best rate is 3e-3 at every depth (2.497,
2.483, 2.504, 2.498 at L 2, 4, 8, 16); depth-muP's is 3e-3 up to L 8 and 1e-2 at L 16
(2.465); standard's is also 3e-3 at every depth, so the drift is not seen at this size. What
differs is depth's payoff: from L 8 to L 16 at 3e-3 standard worsens (2.512 -> 2.638) while
CompleteP holds (2.504 -> 2.498) and depth-muP at its best rate improves (2.496 -> 2.465).
All three are one model at L 2 (the base depth): 2.497 at 3e-3.
"""

from depthscale.experiment import transfer_config
from depthscale.ladder import Rung, cross

FAMILIES = ('standard', 'depth_mup', 'completep')
DEPTHS = (2, 4, 8, 16)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)


def get_config(arg: str | None = None):
  return transfer_config(arg or 'completep', d_model=64, num_heads=2, num_layers=2,
                         base_d_model=64, base_num_layers=2)


def get_ladder(arg: str | None = None):
  families = (arg,) if arg else FAMILIES
  rungs = [Rung(f'L{l}_lr{lr:g}', {'model.num_layers': l, 'optim.lr': lr})
           for l in DEPTHS for lr in LRS]
  return cross({f: {'model.parametrization': f} for f in families}, rungs)
