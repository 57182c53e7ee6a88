"""Transformers without normalization: LayerNorm vs DyT (tanh(alpha x)) vs Derf
(erf(alpha x + s)) in every norm position, with the fraction of saturated DyT/Derf
units per block over training. Backs notebooks/norm_free.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_norm_free.py:cpu --workdir=runs/norm_free

Runtime: see notebooks/norm_free.py and the README (cpu: 3 norms x 3 seeds, L8 d64, 300 steps).
Expected result (measured, cpu): see notebooks/norm_free.py; DyT and Derf train without
any normalization, and their saturation fraction per block is logged over training.
Paper size: GPT-2 small (12 layers, d 768, 12 heads, T 1024, learned positions, GELU MLP,
tied head) with GPT-2's 50,257-token BPE vocabulary padded to 50,304. The papers' language
models: DyT's are LLaMA 7B-70B (notebooks/norm_free.py); the regime paper's (arXiv
2604.23434) GPT-2 models of 64M-3.78B parameters trained on 1M-118M tokens; Derf's abstract
names vision, speech and DNA models. Their corpora, learning rates and schedules are not
known from what was read, so this GPT-2 and its recipe stand in: 512 sequences x 20,000
steps (10.5B tokens), lr 3e-3 (the optim default), 2,000 warmup steps then cosine to 10%,
AdamW with weight decay 0.1. Data: a corpus tokenized with GPT-2's tokenizer.json (supplied
by the user):
  python -m depthscale.data.prepare --input='CORPUS/*.jsonl' --output=data/corpus-gpt2 \
      --tokenizer=PATH/tokenizer.json --workers=8
then `--config.data.source='array_record:data/corpus-gpt2/train-*.array_record'` (without it
the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-16`, recorded in
experiments/dryrun/repro_norm_free.paper.v5p-16.json): v5p-16 holds the ladder, 8-way data
parallel (64 sequences per chip); v5p-8 was not compiled with this vocabulary (with the byte
vocabulary the TPU compiler refused the DyT rung there). 124.4M parameters per rung (39.4M of
them the embedding and positions); per-chip peaks LayerNorm 72.8 GiB, DyT and Derf 82.0 GiB;
MFU estimate 100% (the FLOPs at peak bound the step: an upper bound). Each step compiled in
at most 283 s on the 2-core host with other jobs running (load ~9).
TPU dry run on v5p-16: every rung fits (peak 82.0 GiB of 88.5 GiB per chip); estimated step
0.122 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=4`, recorded in
experiments/dryrun/repro_norm_free.paper.h100-8x4.json): four nodes are the fewest that hold
the ladder, 32-way data parallel (16 sequences per GPU); on two nodes (32 per GPU) the DyT
rung's plain step peaks at 72.8 GiB. Per-GPU peaks: LayerNorm 35.4 GiB, DyT and Derf 37.7
GiB. model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16).
GPU dry run on 4 h100-8 nodes: every rung fits (peak 37.7 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.0722-0.0736 s (roofline estimate, not measured).
"""

from depthscale.natural_text import TextSizes
from depthscale.ladder import Rung, cross
from depthscale.experiment import GPT2_VOCAB, study_config

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (4, 32, 1, 32, 8, 60, 1, 10),
    'cpu': (8, 64, 2, 64, 16, 300, 3, 25),
    'paper': (12, 768, 12, 1024, 512, 20000, 1, 200),  # the GPT-2 small shape
}
# the paper size's GPT-2: its BPE vocabulary and learned positions (GELU MLP, tied head)
PAPER_MODEL = {'vocab_size': GPT2_VOCAB, 'position': 'learned'}
NORMS = {n: {'model.norm': n} for n in ('layernorm', 'dyt', 'derf')}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      num_layers=num_layers, d_model=d_model, num_heads=heads,
                      **(PAPER_MODEL if arg == 'paper' else {}))


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(NORMS, [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])


# `smoke-text`, `cpu-text`: seed 0 on the built-in python_docs corpus (English prose, byte
# tokens), evaluated at every quarter of the steps (depthscale.natural_text); smoke-text:
# DyT only. cpu-text trains 307,200 tokens: 0.78 tokens per non-embedding parameter.
# Measured at cpu-text (seed 0, lr 3e-3, beside other jobs, load average up to 9.5), eval
# loss at 50% / 100% of the steps: LayerNorm 2.60 / 2.32, Derf 3.344 / 3.334, DyT 3.345 /
# 3.334; the same order at both points (one seed at one rate: an order, not a ranking).
TEXT = TextSizes({'smoke': ('dyt',), 'cpu': tuple(NORMS)})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
