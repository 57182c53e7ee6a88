"""Every normalization placement of the depth-scaling literature on one depth ladder.

Run:
  python -m depthscale.main --config=experiments/norm_placement.py --workdir=runs/norm_placement

Ladder: the 14 placements of depthscale.model.placements.PLACEMENTS (post_ln, pre_ln,
peri_ln, sandwich_ln, mix_ln, deepnorm, sub_ln, normformer, hybridnorm, hybridnorm_star,
keel, branchnorm, ngpt, simple_norm) at depths 2 and 8 (28 rungs), d_model 64, 150 steps
each, on the embedded synthetic data. All use RMSNorm and SwiGLU (nGPT needs SwiGLU) except as the
method prescribes; nGPT runs without weight decay and warmup, as in its code.

Runtime: ESTIMATED, not measured end to end: the quickstart measures ~30 s per rung at
this size on an idle 2-core CPU, so 28 rungs take about 14 minutes. Measured here only
with --config.train.steps=3 on a machine shared by ~5 jobs (load 15-20): 1.5-2 min per
rung, mostly compilation.
That run finished the first 9 rungs (pre_ln, post_ln, peri_ln, sandwich_ln at L2
and L8, mix_ln L2) before its time limit; every placement also trains 20 steps in
tests/test_norm_training.py.

Expected result (what the papers report, to be reproduced at scale on accelerators):
Post-LN diverges or lags without warmup as depth grows (Xiong et al. 2020); DeepNorm
trains 1,000-layer Post-LN models stably (Wang et al. 2022); Sub-LN/Magneto and
NormFormer improve pretraining perplexity over Pre-LN (NormFormer: the same perplexity
22% faster at 1.3B); Peri-LN gives more balanced variance growth and steadier training
than Pre-/Post-LN up to 3.2B; Mix-LN beats both Pre- and Post-LN from 70M to 7B;
HybridNorm(*) beats Pre-Norm at 1.2B dense / MoE; Keel trains Post-LN stably past 1,000
layers; nGPT reaches the same loss with 4-20x fewer steps; SimpleGPT allows 3-10x larger
learning rates."""

from depthscale.experiment import small_config
from depthscale.ladder import cross, depth_sweep
from depthscale.model.placements import PLACEMENTS

NGPT = {'optim.weight_decay': 0.0, 'optim.warmup_steps': 0, 'model.tie_embeddings': False}
# BranchNorm (a reconstruction, see README): LayerNorm, branch normalization fading over 100 steps
BRANCHNORM = {'model.norm': 'layernorm', 'train.branchnorm_steps': 100}


def get_config(arg: str | None = None):
  """The quickstart's small run (d_model 64, T 128, batch 16, 150 steps) with RMSNorm and SwiGLU."""
  del arg
  c = small_config()
  c.model.norm = 'rmsnorm'
  c.model.mlp = 'swiglu'
  return c


def get_ladder(arg: str | None = None):
  del arg
  extra = {'ngpt': NGPT, 'branchnorm': BRANCHNORM}
  variants = {b: {'model.block': b, **extra.get(b, {})} for b in PLACEMENTS}
  return cross(variants, depth_sweep([2, 8]))
