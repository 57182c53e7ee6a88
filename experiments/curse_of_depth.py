"""The Curse of Depth: Pre-LN vs LayerNorm Scaling vs Mix-LN over depth.

Run:
  python -m depthscale.main --config=experiments/curse_of_depth.py --workdir=runs/curse_of_depth

Ladder: pre_ln, lns (Pre-LN with model.ln_scaling: norm outputs times 1/sqrt(l)) and
mix_ln (first floor(0.25 L) blocks Post-LN) at depths 4, 8 and 16 (9 rungs), d_model 64,
RMSNorm (eps 1e-6 as in the authors' LLaMA code), SwiGLU, N(0, 0.02) init without
depth-scaled output init (the LNS authors' recommendation), 200 steps. Compare
`final_eval_loss` and the per-layer `update_ratio` / `grad_norm` in layer_metrics.jsonl:
the deeper blocks of Pre-LN should update least.

Runtime: ESTIMATED, not measured end to end: the quickstart measures ~30 s per rung at
this size on an idle 2-core CPU, so 9 rungs (200 steps, up to L=16) take about 6-8 minutes. Measured here only
with --config.train.steps=3 on a machine shared by ~5 jobs (load 15-20): 1.5-2 min per
rung, mostly compilation.

Expected result (what the papers report at 130M-1B on LLaMA/C4, to be reproduced at scale
on accelerators): LayerNorm Scaling lowers perplexity against Pre-LN at every size and
makes deep layers contribute more (pruning them hurts more), and the gain carries over to
fine-tuning (Sun et al. 2025). Mix-LN beats both Pre-LN and Post-LN from 70M to 7B, with
more uniform gradient norms across layers (Li et al. 2025)."""

from depthscale.experiment import small_config
from depthscale.ladder import cross, depth_sweep


def get_config(arg: str | None = None):
  """The quickstart's small run (d_model 64, T 128, batch 16, 150 steps) with RMSNorm (eps 1e-6), SwiGLU and 200 steps."""
  del arg
  c = small_config()
  c.model.norm = 'rmsnorm'
  c.model.norm_eps = 1e-6
  c.model.mlp = 'swiglu'
  c.train.steps = 200
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  c.optim.warmup_steps = 20
  return c


def get_ladder(arg: str | None = None):
  del arg
  variants = {'pre_ln': {'model.block': 'pre_ln'},
              'lns': {'model.block': 'pre_ln', 'model.ln_scaling': True},
              'mix_ln': {'model.block': 'mix_ln'}}
  return cross(variants, depth_sweep([4, 8, 16]))
