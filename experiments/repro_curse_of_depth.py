"""Curse of Depth (Sun et al. 2025): Pre-LN residual variance grows with depth and deep
blocks contribute little; LayerNorm Scaling (pre-norm outputs times 1/sqrt(l)) and Mix-LN
(Post-LN in the first blocks) are the fixes. Backs notebooks/curse_of_depth.py.

Run (arg = smoke | cpu | paper | smoke-text | cpu-text; default cpu):
  python -m depthscale.main --config=experiments/repro_curse_of_depth.py:cpu --workdir=runs/curse_of_depth

`smoke-text` and `cpu-text` train on natural text instead of the synthetic mix: the
built-in `python_docs` corpus (English prose shipped with Python, byte tokens, vocab 256),
with Pre-LN and LNS only and one seed (smoke-text: Pre-LN only), evaluated at every quarter
of the steps (depthscale.natural_text). cpu-text trains 307,200 tokens: 0.39 tokens per
non-embedding parameter.

Runtime: cpu (9 rungs: 3 variants x 3 seeds, L16 d64, 300 steps, analyses at the end)
measured ~4 min per rung on a shared 2-core machine (load ~8), ~35 min in all; an idle
machine should take roughly a third of that (estimate). smoke: 3 rungs of L8 d32.
Expected result (measured, cpu, Pre-LN over 3 seeds, LNS over 1): Pre-LN act_var of the
last block / the first is 14.9 +- 0.5 at init and 59 +- 7 after training (LNS: 3.0 and
6.1); the update ratio of the last 4 blocks / block 2 is 0.14 +- 0.03; skipping one of
the first 4 blocks costs 0.57 +- 0.06 nats, one of the last 8 0.009 +- 0.004. Eval loss:
Pre-LN 2.35 +- 0.02, LNS 2.36 (no gain at this size).
cpu-text (measured in an earlier run, seed 0, ~5 min per rung at load ~17): Pre-LN act_var
last / first block 18.5 at init, 3.2 trained; update ratio last 4 / block 2 0.32; skip cost
first quarter 0.46 nats, last half 0.021. LNS 1.65 trained. Eval loss (nats per byte) at
50% / 100% of the steps, rerun with an eval at every quarter (seed 0, 350-388 s per rung
beside other jobs at load average 11-13): LNS 2.57 / 2.32, Pre-LN 2.80 / 2.52; the same
order at both points (one seed: an order, not a ranking by intervals).
Paper size: the LLaMA-350M shape of the GaLore-derived code the LNS, Mix-LN and ProRes
repositories share (24 layers, d 1024, 16 heads, SwiGLU width 2736 as ProRes'
configs/llama_350m.json; RMSNorm eps 1e-6 as the LNS and Mix-LN code; RoPE; vocabulary
32,000), T 256. The LNS recipe, from its code (lmsdss/LayerNorm-Scaling torchrun_main.py and
run_130m.sh; the paper's tables were not read): C4 (`allenai/c4`, en) tokenized with T5's
SentencePiece model (32,000 pieces), T 256, Adam at lr 1e-3 without weight decay or
clipping, 2,000 warmup steps then cosine to 10%, 512 sequences x 20,000 steps (2.6B tokens)
for the 130M model; the larger sizes' token counts are not known from what was read (the
spec gives lr 5e-4 and 1,000 warmup steps for 1B). This size: 256 sequences x 20,000 steps
(1.3B tokens), lr 1e-3, 2,000 warmup steps then cosine to 10%, AdamW with the optim default
weight decay 0.1. Data: a C4 dump tokenized with T5's spiece.model (supplied by the user),
then
  python -m depthscale.data.prepare --input='c4/en/c4-train.*.json.gz' --output=data/c4-t5 \
      --tokenizer=PATH/spiece.model --workers=8
  python -m depthscale.main --config=experiments/repro_curse_of_depth.py:paper \
      --workdir=runs/curse_of_depth_paper --config.data.source='array_record:data/c4-t5/train-*.array_record'
(without data.source the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-8`, recorded in
experiments/dryrun/repro_curse_of_depth.paper.v5p-8.json): v5p-8 is the smallest v5p slice;
335.2M parameters per rung (32.8M of them the embedding), 4-way data parallel, MFU estimate
42-54%.
TPU dry run on v5p-8: every rung fits (peak 56.7 GiB of 88.5 GiB per chip); estimated step
0.137-0.176 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8`, recorded in
experiments/dryrun/repro_curse_of_depth.paper.h100-8x1.json): one node holds the ladder,
8-way data parallel; model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16).
For the Pre-LN and LNS rungs XLA-GPU (jax 0.10.2) finds no Triton tile sizes for the fused
SwiGLU input projection in the 2-layer cost probe; those probes are compiled with cuBLAS
matmuls (dryrun.PROBE_FALLBACK), whose FLOPs XLA's cost model does not count, nor, it seems,
their bytes (125.0 GB per GPU per step against 287.5 GB for the Mix-LN rung, whose probes
compiled with Triton's GEMMs), so their estimates (0.0373 s) are too low.
GPU dry run on 1 h100-8 node: every rung fits (peak 34.4 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.0373-0.0858 s (roofline estimate, not measured).
"""

from depthscale.ladder import Rung, cross
from depthscale.experiment import LLAMA_BLOCK, LLAMA_VOCAB, study_config
from depthscale.natural_text import TextSizes

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (8, 32, 1, 32, 8, 60, 1, 20),
    'cpu': (16, 64, 2, 64, 16, 300, 3, 50),
    'paper': (24, 1024, 16, 256, 256, 20000, 1, 500),  # the LLaMA-350M shape
}
# the paper size's LLaMA block: the SwiGLU width of the LLaMA-350M config (ProRes'
# configs/llama_350m.json), RMSNorm eps 1e-6 as in the LNS and Mix-LN code
PAPER_MODEL = {**LLAMA_BLOCK, 'd_ff': 2736, 'norm_eps': 1e-6, 'vocab_size': LLAMA_VOCAB}
VARIANTS = {
    'pre_ln': {'model.block': 'pre_ln'},
    'lns': {'model.block': 'pre_ln', 'model.ln_scaling': True},
    'mix_ln': {'model.block': 'mix_ln', 'model.mix_ln_alpha': 0.25},
}


def get_config(arg: str | None = None):
  size = arg or 'cpu'
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[size]
  c = study_config(size, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                   analyses=True,  # skip-layer, logit-lens and effective-depth analyses
                   num_layers=num_layers, d_model=d_model, num_heads=heads,
                   **(PAPER_MODEL if size == 'paper' else {}))
  c.model.init_std = 0.02  # the authors' init (no depth-scaled init with LNS)
  c.optim.lr = 1e-3 if size == 'paper' else 3e-3
  return c


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(VARIANTS, [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])


# `<size>-text` (see the top): Pre-LN and LNS, seed 0 (smoke: Pre-LN only)
TEXT = TextSizes({'smoke': ('pre_ln',), 'cpu': ('pre_ln', 'lns')})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
