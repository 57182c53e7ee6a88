"""Norm-free Transformers: LayerNorm vs RMSNorm vs DyT vs Derf, all Pre-LN.

Run:
  python -m depthscale.main --config=experiments/norm_free.py --workdir=runs/norm_free

Ladder: model.norm in layernorm, rmsnorm, dyt, derf at depths 2 and 8 (8 rungs), d_model
64, SwiGLU, 150 steps. DyT/Derf replace every norm (block inputs and the final norm) and
scale the embedding by a learnable scalar initialized to sqrt(D). alpha0 = 1.0 at every
position (Derf's GPT-2 setting): the authors give no values for widths below 4096, so a
sweep of model.norm_alpha_attn / _mlp / _final is part of the study.

Runtime: ESTIMATED, not measured end to end: the quickstart measures ~30 s per rung at
this size on an idle 2-core CPU, so 8 rungs take about 4 minutes. Measured here only
with --config.train.steps=3 on a machine shared by ~5 jobs (load 15-20): 1.5-2 min per
rung, mostly compilation.

Expected result (what the papers report, to be reproduced at scale on accelerators): DyT
matches or exceeds LayerNorm/RMSNorm across vision and language, LLaMA 7B-70B included,
mostly without tuning (Zhu et al. 2025); Derf outperforms LayerNorm, RMSNorm and DyT
across vision, speech and DNA models, the gain coming from generalization (Chen et al.
2025); DyT's benefit is regime-dependent: it helps at small token budgets and hurts at
larger ones ("DyT is regime-dependent", 2026)."""


from depthscale.experiment import small_config
from depthscale.ladder import cross, depth_sweep


def get_config(arg: str | None = None):
  """The quickstart's small run (d_model 64, T 128, batch 16, 150 steps) with SwiGLU."""
  del arg
  c = small_config()
  c.model.mlp = 'swiglu'
  return c


def get_ladder(arg: str | None = None):
  del arg
  return cross({n: {'model.norm': n} for n in ('layernorm', 'rmsnorm', 'dyt', 'derf')},
               depth_sweep([2, 8]))
