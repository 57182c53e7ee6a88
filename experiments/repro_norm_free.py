"""Transformers without normalization: LayerNorm vs DyT (tanh(alpha x)) vs Derf
(erf(alpha x + s)) in every norm position, with the fraction of saturated DyT/Derf
units per block over training. Backs notebooks/norm_free.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_norm_free.py:cpu --workdir=runs/norm_free

Runtime: see notebooks/norm_free.py and the README (cpu: 3 norms x 3 seeds, L8 d64, 300 steps).
Expected result (measured, cpu): see notebooks/norm_free.py; DyT and Derf train without
any normalization, and their saturation fraction per block is logged over training.
"""

from depthscale.config import default_config
from depthscale.ladder import Rung, cross

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (4, 32, 1, 32, 8, 60, 1, 10),
    'cpu': (8, 64, 2, 64, 16, 300, 3, 25),
    'paper': (12, 768, 12, 1024, 512, 20000, 1, 200),  # ~GPT-2 small / LLaMA-style 124M
}
NORMS = {n: {'model.norm': n} for n in ('layernorm', 'dyt', 'derf')}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = num_layers, d_model, heads
  c.data.seq_len, c.data.batch_size, c.data.eval_batches = seq_len, batch, 2
  c.train.steps, c.train.log_every = steps, log_every
  c.train.eval_every = c.train.checkpoint_every = steps
  c.metrics.analysis_every = 0  # no periodic analyses: this study reads the training logs
  c.metrics.images = 'smoke' not in (arg or '')  # TensorBoard heatmaps at the end (skipped in CI)
  c.optim.warmup_steps = steps // 10
  return c


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(NORMS, [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])
