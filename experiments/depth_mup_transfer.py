"""LR sweep x depth ladder under standard, depth-muP and CompleteP (Dey et al. 2025).

Run:
  python -m depthscale.main --config=experiments/depth_mup_transfer.py --workdir=runs/dmt
  python -m depthscale.main --config=experiments/depth_mup_transfer.py:completep ...  (one family)
Coordinate check of the same setup (about 1 minute per family on a 2-core CPU):
  python -m depthscale.coord_check --config=experiments/depth_mup_transfer.py:completep \
      --vary=num_layers --out=runs/coord_completep

Runtime: 3 families x 4 depths (2, 4, 8, 16) x 4 LRs = 48 rungs of d_model 64, 200 steps;
roughly 1.5 hours on a 2-core CPU (not measured end to end).
Expected result (the CompleteP claim, not yet measured here): the loss-minimizing LR
stays put across depth under CompleteP (base depth 2), drifts under standard.
"""

from depthscale.config import default_config
from depthscale.ladder import Rung, cross

FAMILIES = ('standard', 'depth_mup', 'completep')
DEPTHS = (2, 4, 8, 16)
LRS = (1e-3, 3e-3, 1e-2, 3e-2)


def get_config(arg: str | None = None):
  c = default_config()
  c.model.parametrization = arg or 'completep'
  c.model.d_model = 64
  c.model.num_heads = 2
  c.model.num_layers = 2
  c.model.base_d_model = 64
  c.model.base_num_layers = 2
  c.data.seq_len = 64
  c.data.batch_size = 8
  c.train.steps = 200
  c.train.log_every = 25
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  c.optim.warmup_steps = 20
  return c


def get_ladder(arg: str | None = None):
  families = (arg,) if arg else FAMILIES
  rungs = [Rung(f'L{l}_lr{lr:g}', {'model.num_layers': l, 'optim.lr': lr})
           for l in DEPTHS for lr in LRS]
  return cross({f: {'model.parametrization': f} for f in families}, rungs)
