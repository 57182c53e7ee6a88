"""Transformers without normalization: LayerNorm vs DyT (tanh(alpha x)) vs Derf
(erf(alpha x + s)) in every norm position, with the fraction of saturated DyT/Derf
units per block over training. Backs notebooks/norm_free.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_norm_free.py:cpu --workdir=runs/norm_free

Runtime: see notebooks/norm_free.py and the README (cpu: 3 norms x 3 seeds, L8 d64, 300 steps).
Expected result (measured, cpu): see notebooks/norm_free.py; DyT and Derf train without
any normalization, and their saturation fraction per block is logged over training.
"""

from depthscale.ladder import Rung, cross
from depthscale.experiment import study_config

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (4, 32, 1, 32, 8, 60, 1, 10),
    'cpu': (8, 64, 2, 64, 16, 300, 3, 25),
    'paper': (12, 768, 12, 1024, 512, 20000, 1, 200),  # ~GPT-2 small / LLaMA-style 124M
}
NORMS = {n: {'model.norm': n} for n in ('layernorm', 'dyt', 'derf')}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      num_layers=num_layers, d_model=d_model, num_heads=heads)


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(NORMS, [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])
