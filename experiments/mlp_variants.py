"""MLP variants: activations without normalization, Pre-CRMSNorm trained from scratch, and
tapered MLP widths at a fixed budget, one rung each against Pre-LN with GELU.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/mlp_variants.py:cpu --workdir=runs/mlp_variants

Ladder (Pre-LN wiring, GELU unless named, seed 0):
  ln_gelu      Pre-LN, LayerNorm: the baseline of every rung
  crms_gelu    Pre-CRMSNorm (model.norm=crmsnorm, model.norm_bias=True; Jiang et al. 2023,
               arXiv 2305.14858): the same function class as Pre-LN, parametrized otherwise
  none_gelu, none_relu, none_relu2   no norm anywhere (model.norm=none) with GELU, ReLU,
               squared ReLU (So et al. 2021, Primer, arXiv 2109.08668)
  taper_cosine, taper_reverse   LayerNorm, MLP width from 1.5 F at block 1 to 0.5 F at block
               L (cosine) and its reverse (Bayat, Behrouz & Courville 2026, Tapered Language
               Models, arXiv 2606.23670); same active MLP units as ln_gelu, but every block
               holds 1.5 F units (masked): 1.5x the MLP compute and memory.
cpu size: L4 d64 (F 256; tapered widths 384, 320, 192, 128), T64, batch 16, 150 steps,
lr 3e-3 with 15 warmup steps, the default 'mix' data.

Runtime (measured, cpu): 14.4 min for the 7 rungs on the 2-core host shared with other jobs
(load average 16-18): 20-34 s of compilation and ~20 s of training (8-14k tokens/s) per
rung, the rest start-up, evaluation, checkpoints and images.
Expected result (what the papers report at scale): without norms ReLU beats GELU (8.2%
lower perplexity, Jha & Reagen 2024, "ReLU's Revival", arXiv 2410.09637); Primer's squared
ReLU beats GELU and ReLU; Pre-CRMSNorm trains like Pre-LN; the cosine taper lowers
perplexity and the reverse taper raises it (Bayat et al. 2026).
Measured (cpu, seed 0 only: the seed-to-seed spread is not measured, so the small gaps may
be noise): final
eval loss ln_gelu 2.519, crms_gelu 2.640, none_gelu 3.197, none_relu 3.226, none_relu2 3.643,
taper_cosine 2.494, taper_reverse 2.550 (final train loss 2.526, 2.641, 3.190, 3.197, 3.637,
2.494, 2.556); counted parameters 214,144 for every rung with norms (the tapered ones
count active units), 212,992 without. At this size and length the norm-free models lag far
behind and ReLU does not beat GELU, squared ReLU is worst; the taper ordering (cosine
-0.025 < uniform < reverse +0.031) matches the paper's.
"""

from depthscale.experiment import study_config
from depthscale.ladder import Rung

SIZES = {  # study_config arguments per size
    'smoke': dict(num_layers=2, d_model=32, num_heads=1, seq_len=32, batch=8, steps=20,
                  log_every=10),
    'cpu': dict(num_layers=4, d_model=64, num_heads=2, seq_len=64, batch=16, steps=150,
                log_every=25),
    'paper': dict(num_layers=24, d_model=1024, num_heads=16, seq_len=1024, batch=512,
                  steps=20000, log_every=200),  # ~440M, the taper paper's smallest scale
}
VARIANTS = {
    'ln_gelu': {},
    'crms_gelu': {'model.norm': 'crmsnorm', 'model.norm_bias': True},
    'none_gelu': {'model.norm': 'none'},
    'none_relu': {'model.norm': 'none', 'model.mlp': 'relu'},
    'none_relu2': {'model.norm': 'none', 'model.mlp': 'relu2'},
    'taper_cosine': {'model.mlp_taper': 'cosine', 'model.mlp_taper_ratio': 1.5},
    'taper_reverse': {'model.mlp_taper': 'reverse', 'model.mlp_taper_ratio': 1.5},
}


def get_config(arg: str | None = None):
  return study_config(arg, **SIZES[arg or 'cpu'])


def get_ladder(arg: str | None = None):
  del arg
  return [Rung(name, overrides) for name, overrides in VARIANTS.items()]
