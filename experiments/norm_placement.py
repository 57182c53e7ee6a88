"""Every normalization placement of the depth-scaling literature on one depth ladder.

Run:
  python -m depthscale.main --config=experiments/norm_placement.py --workdir=runs/norm_placement

Ladder: the 13 placements of depthscale.blocks.PLACEMENTS (post_ln, pre_ln, peri_ln,
sandwich_ln, mix_ln, deepnorm, sub_ln, normformer, hybridnorm, hybridnorm_star, keel,
ngpt, simple_norm) at depths 2 and 8 (26 rungs), d_model 64, 150 steps each, on the
embedded synthetic data. All use RMSNorm and SwiGLU (nGPT needs SwiGLU) except as the
method prescribes; nGPT runs without weight decay and warmup, as in its code.

Runtime (measured): one rung at L=8 took about 40 s on this 2-core CPU while ~5 other
jobs shared it (at L=2 about half); the full ladder is therefore an estimate of about
12-15 minutes on an idle machine (not run end to end here; see the command with
--config.train.steps=3, which runs every rung).

Expected result (what the papers report, to be reproduced at scale on accelerators):
Post-LN diverges or lags without warmup as depth grows (Xiong et al. 2020); DeepNorm
trains 1,000-layer Post-LN models stably (Wang et al. 2022); Sub-LN/Magneto and
NormFormer improve pretraining perplexity over Pre-LN (NormFormer: the same perplexity
22% faster at 1.3B); Peri-LN gives more balanced variance growth and steadier training
than Pre-/Post-LN up to 3.2B; Mix-LN beats both Pre- and Post-LN from 70M to 7B;
HybridNorm(*) beats Pre-Norm at 1.2B dense / MoE; Keel trains Post-LN stably past 1,000
layers; nGPT reaches the same loss with 4-20x fewer steps; SimpleGPT allows 3-10x larger
learning rates."""

from depthscale.blocks import PLACEMENTS
import os

from depthscale.experiment import load_module
from depthscale.ladder import cross, depth_sweep

NGPT = {'optim.weight_decay': 0.0, 'optim.warmup_steps': 0, 'model.tie_embeddings': False}


def get_config(arg: str | None = None):
  """The quickstart's small run (d_model 64, T 128, batch 16, 150 steps) with RMSNorm and SwiGLU."""
  c = load_module(os.path.join(os.path.dirname(__file__), 'quickstart.py')).get_config(arg)
  c.model.norm = 'rmsnorm'
  c.model.mlp = 'swiglu'
  return c


def get_ladder(arg: str | None = None):
  del arg
  variants = {b: {'model.block': b, **(NGPT if b == 'ngpt' else {})} for b in PLACEMENTS}
  return cross(variants, depth_sweep([2, 8]))
