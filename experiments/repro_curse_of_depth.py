"""Curse of Depth (Sun et al. 2025): Pre-LN residual variance grows with depth and deep
blocks contribute little; LayerNorm Scaling (pre-norm outputs times 1/sqrt(l)) and Mix-LN
(Post-LN in the first blocks) are the fixes. Backs notebooks/curse_of_depth.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_curse_of_depth.py:cpu --workdir=runs/curse_of_depth

Runtime: cpu (9 rungs: 3 variants x 3 seeds, L16 d64, 300 steps) about 8 minutes on a
2-core CPU; smoke (3 rungs, L8 d32, 60 steps) about 25 s.
Expected result (measured, cpu): Pre-LN act_var grows with depth at step 0 and after
training; LayerNorm Scaling keeps it several times lower; the per-layer update ratio
falls with depth. See notebooks/curse_of_depth.py for the measured numbers.
"""

from depthscale.config import default_config
from depthscale.ladder import Rung, cross

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (8, 32, 1, 32, 8, 60, 1, 20),
    'cpu': (16, 64, 2, 64, 16, 300, 3, 50),
    'paper': (24, 1024, 16, 256, 256, 20000, 1, 500),  # ~LLaMA-250M shape (the paper's 2nd size)
}
VARIANTS = {
    'pre_ln': {'model.block': 'pre_ln'},
    'lns': {'model.block': 'pre_ln', 'model.ln_scaling': True},
    'mix_ln': {'model.block': 'mix_ln', 'model.mix_ln_alpha': 0.25},
}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = num_layers, d_model, heads
  c.model.init_std = 0.02  # the authors' init (no depth-scaled init with LNS)
  c.data.seq_len, c.data.batch_size, c.data.eval_batches = seq_len, batch, 2
  c.train.steps, c.train.log_every = steps, log_every
  c.train.eval_every = c.train.checkpoint_every = steps
  c.metrics.analysis_every = steps  # skip-layer, logit-lens and effective-depth analyses at the end
  c.metrics.images = 'smoke' not in (arg or '')  # TensorBoard heatmaps at the end (skipped in CI)
  c.optim.lr, c.optim.warmup_steps = 1e-3 if arg == 'paper' else 3e-3, steps // 10
  return c


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(VARIANTS, [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])
