"""Training-dynamics methods seen through per-layer metrics: ProRes (progressive residual
warmup, deeper blocks later), LayerDrop (random block skipping) and LayerSkip (depth-
increasing layer dropout plus an early-exit loss). Backs notebooks/training_dynamics.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_training_dynamics.py:cpu --workdir=runs/training_dynamics

Runtime: see notebooks/training_dynamics.py and the README (cpu: 6 variants x 3 seeds,
L8 d64, 300 steps).
Expected result (measured, cpu): under ProRes the deep blocks' update ratio stays near 0
until their warmup starts; LayerDrop makes skipping a single block cost less loss (than
Pre-LN, and at the cpu size than pre_ln_quarter, Pre-LN trained a quarter as long to
about LayerDrop's loss: the undertraining control);
LayerSkip brings the early layers' logit-lens predictions closer to the final ones (and,
at the smoke size, closer than its control layerskip_no_exit: the same layer dropout
without the early-exit loss).
Paper size on TPU (`--dry_run --topology=v5p-16`, recorded in
experiments/dryrun/repro_training_dynamics.paper.v5p-16.json): v5p-16 is the smallest v5p
slice that holds the ladder. On v5p-8 the TPU compiler refuses the layerskip rung (114.8 GB
of temporaries against 95.7 GB of HBM per chip; `model.remat=nothing_saveable` would fit
it at a peak of 24.5 GiB); 302.4M parameters per rung, 8-way data parallel.
TPU dry run on v5p-16: every rung fits (peak 63.7 GiB of 88.5 GiB per chip); estimated step
0.2 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=4`, recorded in
experiments/dryrun/repro_training_dynamics.paper.h100-8x4.json): four nodes are the fewest
that hold the ladder as configured, 32-way data parallel; on two nodes (16 sequences per
GPU) the Pre-LN rung's peak is 79.5 GiB (`model.remat=nothing_saveable` would fit it at
10.0 GiB). model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16).
GPU dry run on 4 h100-8 nodes: every rung fits (peak 42.4 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.0908 s (roofline estimate, not measured).
"""

from depthscale.ladder import Rung, cross
from depthscale.experiment import study_config

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (6, 32, 1, 32, 8, 60, 1, 5),
    'cpu': (8, 64, 2, 64, 16, 300, 3, 10),
    'paper': (24, 1024, 16, 1024, 256, 20000, 1, 200),
}


def variants(arg: str | None) -> dict[str, dict]:
  """Baseline Pre-LN and the three methods; ProRes warms up over the first half."""
  steps = SIZES[arg or 'cpu'][5]
  return {
      'pre_ln': {},
      'prores': {'train.prores': 'linear', 'train.prores_warmup_steps': steps // 2},
      'layerdrop': {'train.layerdrop': 0.2},
      'layerskip': {'train.layerskip_p_max': 0.2, 'train.early_exit_scale': 0.1},
      # control: LayerSkip's layer dropout without its early-exit loss
      'layerskip_no_exit': {'train.layerskip_p_max': 0.2, 'train.early_exit_scale': 0.0},
      # control: Pre-LN trained a quarter as long, to about LayerDrop's loss (cpu size)
      'pre_ln_quarter': {'train.steps': steps // 4},
  }


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      analyses=True,  # the skip-layer and logit-lens analyses
                      num_layers=num_layers, d_model=d_model, num_heads=heads)


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(variants(arg), [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])
