"""Outlier-safe pre-training (OSP; Park et al. 2025, arXiv 2506.19697) vs Adam: activation
kurtosis and max |activation| of the residual stream per block, and the loss, each
optimizer at each of three learning rates.

Run (arg = smoke | cpu; default cpu):
  python -m depthscale.main --config=experiments/outlier_safe.py:cpu --workdir=runs/outlier_safe

Rungs: adam = AdamW with per-channel RMSNorm gains; osp = Muon on every matrix (AdamW on
embeddings, head and norm scales), single-scale RMSNorm and the learnable embedding
projection. Both: Pre-LN, SwiGLU, untied head, as in the paper's LLaMA models. Muon's
updates are scaled to RMS 0.2 (optim.muon_rms, as in the authors' code) so both share the
LR grid; each is read at its own best LR.

Runtime: cpu is 6 rungs (2 methods x 3 LRs) of L4 d64, T64, batch 16, 300 steps, seed 0:
measured ~40 s of CPU time per rung (7 rungs, the six below and osp at 1e-3, took 4.6
CPU-minutes and 16 minutes of wall time on a 2-core host at load average 10-17, other jobs
running).
Expected result (the paper, 1.4B parameters, 1T tokens): OSP's excess kurtosis stays near
0 (0.04) where Adam's reaches 1818, at a loss close to Adam's; the metrics here are the
plain kurtosis of the residual stream (Gaussian 3) and max |x|, per block.
Measured (cpu, seed 0, step 300; kurtosis and max |x| of blocks 1..4):
  rung       eval loss  kurtosis               max |x|
  adam 1e-3  2.391      2.47 2.36 2.12 1.90    0.53  0.68  1.10  1.18
  adam 3e-3  2.265      2.47 2.47 2.39 2.28    3.41  4.63  5.74  6.17   (Adam's best LR)
  adam 1e-2  2.334      3.84 3.98 4.11 4.10    156   153   154   156
  osp  3e-3  2.223      2.98 3.03 2.94 3.35    1.10  1.26  1.85  2.27
  osp  1e-2  2.164      3.31 3.11 3.01 3.29    7.65  12.3  28.9  31.3   (OSP's best LR)
  osp  3e-2  2.191      2.78 2.84 2.97 3.12    91    168   219   279
(osp at 1e-3, run in an earlier grid: 2.399; kurtosis 2.84-3.46, max |x| 0.24-0.59.)
At each method's best LR OSP reaches a 0.10 nat lower eval loss. At equal LR OSP's max |x|
is below Adam's in every block (2-20x) and its kurtosis stays at 2.8-3.5 at every LR,
while Adam's goes from 1.9-2.5 (1e-3, 3e-3) to 3.8-4.1 at 1e-2; but OSP's best LR is
higher, and there its max |x| (31) is above Adam's at Adam's best (6.2). At this size
(0.3M tokens) no heavy-tailed outliers form under Adam at its best LR, so the paper's
kurtosis gap is not reproduced here. One seed: the seed-to-seed spread is not measured.
"""

from depthscale.experiment import study_config
from depthscale.ladder import Rung

# name -> (L, D, heads, seq_len, batch, steps, log_every)
SIZES = {
    'smoke': (2, 32, 2, 32, 8, 40, 10),
    'cpu': (4, 64, 2, 64, 16, 300, 50),
}
METHODS = {
    'adam': {'optim.name': 'adamw', 'model.norm': 'rmsnorm'},
    'osp': {'optim.name': 'muon', 'model.norm': 'ss_rmsnorm', 'model.embed_projection': True},
}
# size -> method -> learning rates: each grid brackets that method's best LR at the cpu size
LRS = {
    'smoke': {'adam': (3e-3,), 'osp': (3e-3,)},
    'cpu': {'adam': (1e-3, 3e-3, 1e-2), 'osp': (3e-3, 1e-2, 3e-2)},
}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, log_every = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                   num_layers=num_layers, d_model=d_model, num_heads=heads)
  c.model.mlp = 'swiglu'
  c.model.tie_embeddings = False
  return c


def get_ladder(arg: str | None = None):
  return [Rung(f'{method}_lr{lr:g}', {**overrides, 'optim.lr': lr})
          for method, overrides in METHODS.items() for lr in LRS[arg or 'cpu'][method]]
