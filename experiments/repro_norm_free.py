"""Transformers without normalization: LayerNorm vs DyT (tanh(alpha x)) vs Derf
(erf(alpha x + s)) in every norm position, with the fraction of saturated DyT/Derf
units per block over training. Backs notebooks/norm_free.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_norm_free.py:cpu --workdir=runs/norm_free

Runtime: see notebooks/norm_free.py and the README (cpu: 3 norms x 3 seeds, L8 d64, 300 steps).
Expected result (measured, cpu): see notebooks/norm_free.py; DyT and Derf train without
any normalization, and their saturation fraction per block is logged over training.
Paper size on TPU (`--dry_run --topology=v5p-16`, recorded in
experiments/dryrun/repro_norm_free.paper.v5p-16.json): the rungs do not fit v5p-8, the
smallest v5p slice (the TPU compiler refuses the DyT rung there), so v5p-16 is the smallest
that holds them; 85.2M parameters per rung (byte vocabulary), 8-way data parallel.
TPU dry run on v5p-16: every rung fits (peak 58.2 GiB of 88.5 GiB per chip); estimated step
0.14-0.147 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=2`, recorded in
experiments/dryrun/repro_norm_free.paper.h100-8x2.json): two nodes are the fewest that hold
the ladder, 16-way data parallel; on one node (64 sequences per GPU) the LayerNorm rung's
peak is 120.2 GiB. model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16).
GPU dry run on 2 h100-8 nodes: every rung fits (peak 65.2 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.12-0.123 s (roofline estimate, not measured).
"""

from depthscale.natural_text import TextSizes
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


# `smoke-text`, `cpu-text`: seed 0 on the built-in python_docs corpus (English prose, byte
# tokens), evaluated at every quarter of the steps (depthscale.natural_text); smoke-text:
# DyT only. cpu-text trains 307,200 tokens: 0.78 tokens per non-embedding parameter.
TEXT = TextSizes({'smoke': ('dyt',), 'cpu': tuple(NORMS)})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
