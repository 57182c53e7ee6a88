"""Width vs depth at a fixed non-embedding budget (DepthBench-style aspect-ratio ladder):
at small scale and short training, deeper-narrower Pre-LN models are worse. Backs
notebooks/width_depth_ladder.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_width_depth_ladder.py:cpu --workdir=runs/width_depth

Runtime: see notebooks/width_depth_ladder.py and the README (cpu: Pre-LN at 3 shapes x 3
seeds, Hyper-Connections, AttnRes and DenseFormer at 3 shapes x 1 seed, 300 steps).
Expected result (measured, cpu): eval loss (d128, L2) < (d64, L8) < (d32, L32) at a
~400k non-embedding budget, with gaps far beyond the seed spread.
"""

from depthscale.ladder import Rung, budget_sweep, cross
from depthscale.experiment import study_config

# name -> (budget, depths, head_dim, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (400_000, [2, 8, 32], 16, 32, 8, 60, 1, 20),
    'cpu': (400_000, [2, 8, 32], 16, 64, 16, 300, 3, 50),
    'paper': (100_000_000, [6, 12, 24, 48, 96], 64, 1024, 256, 20000, 1, 500),
}
BASELINE = {'pre_ln': {'model.block': 'pre_ln', 'model.residual': 'standard'}}
DESIGNS = {  # residual-stream designs, one seed each (all Pre-LN blocks)
    'hyper_connections': {'model.residual': 'hyper_connections'},
    'attn_res': {'model.residual': 'attn_res'},
    'denseformer': {'model.residual': 'denseformer'},
}


def get_config(arg: str | None = None):
  *_, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every)


def get_ladder(arg: str | None = None):
  budget, depths, head_dim, *_, seeds, _ = SIZES[arg or 'cpu']
  shapes = budget_sweep(budget, depths, head_dim=head_dim)
  if arg == 'smoke':  # the designs at the middle shape only
    shapes_for_designs = shapes[len(shapes) // 2:len(shapes) // 2 + 1]
  else:
    shapes_for_designs = shapes
  return (cross(BASELINE, cross({f's{s}': {'train.seed': s} for s in range(seeds)}, shapes))
          + cross(DESIGNS, cross({'s0': {}}, shapes_for_designs)))
