"""Hyperparameter transfer across depth: a coordinate check and an LR sweep over a depth
ladder under the standard parametrization, depth-muP (branches times (L/L0)^-1/2) and
CompleteP ((L/L0)^-1, hidden Adam LR unchanged). Backs notebooks/depth_transfer.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_depth_transfer.py:cpu --workdir=runs/depth_transfer
  python -m depthscale.coord_check --config=experiments/repro_depth_transfer.py:cpu --vary=num_layers \
      --values=2,4,8,16 --out=runs/coord --config.model.parametrization=completep

Runtime: see notebooks/depth_transfer.py and the README (cpu: 3 parametrizations x 4
depths x 4 learning rates, d32, 200 steps).
Expected result (measured, cpu): after a few steps the last block's activation RMS grows
with depth under the standard parametrization and stays flat under depth-muP and
CompleteP (the coordinate check); the best learning rate per depth is reported.
Paper size on TPU (`--dry_run --topology=v5p-256`, recorded in
experiments/dryrun/repro_depth_transfer.paper.v5p-256.json; 168 rungs, 21 distinct programs: 3
parametrizations x depths 2-128 at d1024, 25.4M-1.61B parameters, 128-way data parallel,
float32, no remat): v5p-256 is the smallest v5p slice that holds the whole ladder as
configured. The L128 rungs decide it; per-chip memory grows linearly with depth (peak 34.1 GiB
at L64, 68.1 GiB at L128) and differs by under 1% between the parametrizations. Measured on
smaller slices and not recorded: on v5p-128 the TPU compiler refuses completep L128 (97.67 GB
of temporaries against 95.74 GB of HBM per chip; `model.remat=nothing_saveable` would fit at
36.5 GiB), and on v5p-64 L128 needs 168 GB of temporaries (remat: 44.1 GiB). MFU estimate
42-46%.
TPU dry run on v5p-256: every rung fits (peak 68.1 GiB of 88.5 GiB per chip); estimated step
0.00428-0.253 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=2
--config.model.remat=nothing_saveable`, recorded in
experiments/dryrun/repro_depth_transfer.paper.h100-8x2.json, which keeps the flag): on GPUs
this ladder needs remat. As configured (no remat) no node count holds its L128 rungs: the
standard L128 rung's peak is 186.9 GiB per GPU on 16 nodes and 106.5 GiB on 32 (one sequence
per GPU, the most a batch of 256 allows). With every block rematerialized (the backward
recomputes each block from its saved input, about one more forward pass) two nodes are the
fewest, 16-way data parallel; on one node, with remat, the completep L128 rung's peak is
92.8 GiB. Per-GPU peak 18.6 GiB at L2 to 58.1 GiB at L128 (18.0 GiB of it float32 parameters
and Adam moments), the same for the three parametrizations. No cheaper named policy saves
more and fits: dots_with_no_batch_dims_saveable compiles to the same 58.1 GiB (the block's
projections are custom-VJP matmuls, ops.matmul, which the dot policies do not see, so it
keeps nothing more), and dots_saveable (checkpoint_dots) also keeps the attention scores:
582.5 GiB. The TPU record above is of the ladder without remat. model.dtype=float32, so
XLA's attention runs; XLA's cost model counts 26-63% of the analytic FLOPs of the GPU
program, so the estimate uses the analytic count, which leaves out the recomputation; the
bytes XLA counts bound the estimated step (MFU estimate 21-31%). Each step compiled in at
most 22 s on the 2-core host with other jobs running (the whole ladder, 21 distinct
programs: 23 minutes).
GPU dry run on 2 h100-8 nodes with model.remat=nothing_saveable: every rung fits (peak 58.1
GiB of 71.2 GiB usable per GPU; XLA's attention); estimated step 0.0324-1.37 s (roofline
estimate, not measured).
"""

from depthscale.ladder import Rung
from depthscale.experiment import study_config

L0 = 2  # base depth: every parametrization agrees at L = L0
# name -> (D, heads, coord-check depths, sweep depths, learning rates, parametrizations,
#          seq_len, batch, steps, log_every)
SIZES = {
    'smoke': (32, 1, [2, 16], [8], [1e-2], ('standard', 'depth_mup', 'completep'), 32, 8, 20, 10),
    'cpu': (32, 1, [2, 4, 8, 16], [2, 4, 8, 16], [1e-3, 3e-3, 1e-2, 3e-2],
            ('standard', 'depth_mup', 'completep'), 64, 16, 200, 50),
    'paper': (1024, 16, [2, 8, 32, 128], [2, 4, 8, 16, 32, 64, 128], [2 ** -k for k in range(4, 12)],
              ('standard', 'depth_mup', 'completep'), 2048, 256, 20000, 500),
}


def get_config(arg: str | None = None):
  d_model, heads, *_, seq_len, batch, steps, log_every = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                   d_model=d_model, num_heads=heads, num_layers=L0, base_num_layers=L0)
  c.optim.lr = 1e-2
  return c


def get_ladder(arg: str | None = None):
  _, _, _, depths, lrs, params, *_ = SIZES[arg or 'cpu']
  return [Rung(f'{p}_s0_L{l}_lr{lr:g}', {'model.parametrization': p, 'model.num_layers': l,
                                         'optim.lr': lr})
          for p in params for l in depths for lr in lrs]
