"""Depth by recurrence (Dehghani et al. 2018, arXiv:1807.03819) and Relaxed Recursive
Transformers (Bae et al. 2024, arXiv:2410.20672): unique depth against loop depth.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/recurrence.py:cpu --workdir=runs/recurrence

Ladder, for U unique blocks looped K times (effective depth L = U K), per seed:
  unique_L{U}         U unique blocks: the looped models' parameters, 1/K of their compute
  unique_L{UK}        U K unique blocks: the looped models' compute, K times their parameters
  loop_U{U}xK{K}      U shared blocks applied K times (plain tying, model.loops = K)
  relaxed_U{U}xK{K}   the same with a rank-r LoRA per loop and block (model.loop_lora_rank)
So loop vs unique_L{U} compares at equal parameters, loop vs unique_L{UK} at equal train
FLOPs (6 N + 12 L T D per token with N the matmul parameters applied per token: U K blocks
for both); each rung's info gives its block parameters and FLOPs per token.

Runtime: cpu (8 rungs: 4 variants x 2 seeds, d_model 32, T 64, batch 8, 200 steps, U 2,
K 3, r 4) measured 18 min in all on the shared 2-core machine (load 16-18, other jobs
running), 18-42 s of each rung compiling; an idle machine should take a fraction of that
(not measured). smoke: 4 rungs of 40 steps.
Expected result (measured, cpu, final eval loss, seeds 0 / 1; non-embedding parameters):
unique_L2 2.634 / 2.559 (24,896), unique_L6 2.621 / 2.522 (74,560), loop_U2xK3
2.760 / 2.593 (24,896), relaxed_U2xK3 2.768 / 2.570 (38,720). Seeds differ by more than
the variants (data order); per seed, looping the two blocks three times is worse than
running them once at equal parameters (+0.126 / +0.034 nats) and worse than six unique
blocks at equal FLOPs (+0.139 / +0.071); the LoRA changes it by +0.008 / -0.023. At this
toy size and budget loop depth does not pay. The paper's claim (a recursive Gemma 1B,
converted from a pretrained Gemma 2B, beats same-size vanilla models, and the relaxed one
recovers most of the full model) concerns conversion of pretrained models at scale, to be
tested with the paper size on accelerators.
"""

from depthscale.experiment import study_config
from depthscale.ladder import Rung, block_params

# name -> (D, heads, seq_len, batch, steps, unique blocks U, loops K, LoRA rank r, seeds, log_every)
SIZES = {
    'smoke': (32, 1, 32, 8, 40, 2, 2, 2, 1, 20),
    'cpu': (32, 2, 64, 8, 200, 2, 3, 4, 2, 50),
    'paper': (1024, 16, 512, 256, 20000, 6, 3, 64, 1, 500),  # at scale (the paper converts Gemma)
}


def get_config(arg: str | None = None):
  d_model, heads, seq_len, batch, steps, *_, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      d_model=d_model, num_heads=heads)


def _info(d_model: int, seq_len: int, unique: int, depth: int, lora: int = 0) -> dict:
  """Block matmul parameters (+ LoRA factors) and train FLOPs per token of one rung."""
  params = block_params(d_model, unique, num_heads=1)
  flops = 6 * block_params(d_model, depth, num_heads=1) + 12 * depth * seq_len * d_model
  return {'block_params': params + lora, 'train_flops_per_token': flops}


def get_ladder(arg: str | None = None):
  d, _, seq_len, _, _, u, k, r, seeds, _ = SIZES[arg or 'cpu']
  lora = k * u * r * (8 * d + 2 * (d + 4 * d))  # q, k, v, o (D -> D each), in and out (D <-> 4D)
  variants = [
      Rung(f'unique_L{u}', {'model.num_layers': u}, _info(d, seq_len, u, u)),
      Rung(f'unique_L{u * k}', {'model.num_layers': u * k}, _info(d, seq_len, u * k, u * k)),
      Rung(f'loop_U{u}xK{k}', {'model.num_layers': u * k, 'model.loops': k},
           _info(d, seq_len, u, u * k)),
      Rung(f'relaxed_U{u}xK{k}', {'model.num_layers': u * k, 'model.loops': k,
                                  'model.loop_lora_rank': r}, _info(d, seq_len, u, u * k, lora)),
  ]
  return [Rung(f'{v.name}_s{s}', {**v.overrides, 'train.seed': s}, v.info)
          for v in variants for s in range(seeds)]
