"""ProRes (Chen et al. 2026): progressive residual warmup vs the plain block, Pre-LN and
Post-LN, at depths 4 and 12.

Run:
  python -m depthscale.main --config=experiments/prores.py --workdir=runs/prores

Runtime: 8 rungs of d_model 64, 300 steps; roughly 15 minutes on a 2-core CPU (not
measured end to end). ProRes uses the repo's 'linear' schedule with T = 10 steps per
layer (W = 10 L), scaled down from the paper's T = 1000 for this budget.
Expected result (the paper's claim, not yet measured here): ProRes trains Post-LN stably
at depth 12 where the plain Post-LN lags, and matches or beats plain Pre-LN.
"""

from depthscale.config import default_config
from depthscale.ladder import Rung, cross

STEPS_PER_LAYER = 10


def get_config(arg: str | None = None):
  del arg
  c = default_config()
  c.model.d_model = 64
  c.model.num_heads = 2
  c.data.seq_len = 64
  c.data.batch_size = 16
  c.train.steps = 300
  c.train.log_every = 25
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  c.optim.warmup_steps = 20
  return c


def get_ladder(arg: str | None = None):
  del arg
  rungs = []
  for l in (4, 12):
    rungs.append(Rung(f'L{l}_plain', {'model.num_layers': l}))
    rungs.append(Rung(f'L{l}_prores', {'model.num_layers': l, 'train.prores': 'linear',
                                        'train.prores_warmup_steps': STEPS_PER_LAYER * l}))
  return cross({'pre_ln': {'model.block': 'pre_ln'}, 'post_ln': {'model.block': 'post_ln'}}, rungs)
