"""Width vs depth at a fixed non-embedding budget (DepthBench-style aspect-ratio ladder):
at small scale and short training, deeper-narrower Pre-LN models are worse. Backs
notebooks/width_depth_ladder.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_width_depth_ladder.py:cpu --workdir=runs/width_depth

Runtime: see notebooks/width_depth_ladder.py and the README (cpu: Pre-LN at 3 shapes x 3
seeds, Hyper-Connections, AttnRes and DenseFormer at 3 shapes x 1 seed, 300 steps).
Expected result (measured, cpu): eval loss (d128, L2) < (d64, L8) < (d32, L32) at a
~400k non-embedding budget, with gaps far beyond the seed spread.
Paper size on TPU (`--dry_run --topology=v5p-16`, recorded in
experiments/dryrun/repro_width_depth_ladder.paper.v5p-16.json; 85-118M parameters, 8-way
data parallel, float32, no remat): every Pre-LN rung fits v5p-16 (peak 22.4 GiB at d1152 L6
to 69.9 GiB at d320 L96; v5p-8 not compiled). Hyper-Connections fit up to L24 (78.8 GiB);
at L48 and L96 the dry run names `model.remat=nothing_saveable` (15.9 and 22.3 GiB).
DenseFormer fits up to L24; L48 fits at half the batch (84.1 GiB), and L96 (439 GB of
temporaries) fits none of the alternatives. AttnRes fits only with remat at L6 and L12
(30.9 and 55.4 GiB); from L24 on, none of the alternatives fits, and at L96 it needs 4.35 TB
of temporaries. AttnRes and DenseFormer carry every earlier block's output through the
layer scan, and the scan's backward keeps that history for every layer: their memory grows
as L^2 d, not L d, so as implemented no v5p slice holds their deep rungs at this batch.
TPU dry run on v5p-16: not every rung fits (peak 96.5 GiB of 88.5 GiB per chip); estimated
step 0.0584-0.392 s (roofline estimate, not measured).
"""

import dataclasses

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
HC_REMAT_DEPTH = 48  # Hyper-Connections from this depth on: model.remat=nothing_saveable


def _remat_deep_hc(rung: Rung) -> Rung:
  """The rung with full remat where Hyper-Connections' 4 streams per layer exceed the chip."""
  o = rung.overrides
  if o.get('model.residual') != 'hyper_connections' or o['model.num_layers'] < HC_REMAT_DEPTH:
    return rung
  return dataclasses.replace(rung, overrides={**o, 'model.remat': 'nothing_saveable'})


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
          + [_remat_deep_hc(r) for r in cross(DESIGNS, cross({'s0': {}}, shapes_for_designs))])
