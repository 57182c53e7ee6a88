"""Width vs depth at a fixed non-embedding budget (DepthBench-style aspect-ratio ladder):
at small scale and short training, deeper-narrower Pre-LN models are worse. Backs
notebooks/width_depth_ladder.py.

Run (arg = smoke | cpu | paper; default cpu):
  python -m depthscale.main --config=experiments/repro_width_depth_ladder.py:cpu --workdir=runs/width_depth

Runtime: see notebooks/width_depth_ladder.py and the README (cpu: Pre-LN at 3 shapes x 3
seeds, Hyper-Connections, AttnRes and DenseFormer at 3 shapes x 1 seed, 300 steps).
Expected result (measured, cpu): eval loss (d128, L2) < (d64, L8) < (d32, L32) at a
~400k non-embedding budget, with gaps far beyond the seed spread.
Paper size: a ~100M non-embedding budget over L 6-96 (head dim 64), T 1024, in LLaMA's
block: RMSNorm, SwiGLU of width 8/3 d (it keeps GELU-4d's 12 d^2 block matrices, so the
budget gives the same shapes), RoPE, and a 32,000-token vocabulary. The papers' blocks,
corpora, tokenizers, token counts and learning rates are not known from what was read
(AttnRes reports up to 48B total / 3B active parameters on 1.4T tokens, see
notebooks/width_depth_ladder.py), so LLaMA's block and SentencePiece vocabulary and this
recipe stand in: 256 sequences x 20,000 steps (5.2B tokens), lr 3e-3 (the optim default),
2,000 warmup steps then cosine to 10%, AdamW with weight decay 0.1. Data: a corpus
tokenized with a 32,000-piece SentencePiece model, e.g. Llama-2's tokenizer.model (supplied
by the user):
  python -m depthscale.data.prepare --input='CORPUS/*.jsonl' --output=data/corpus-llama2 \
      --tokenizer=PATH/tokenizer.model --workers=8
then `--config.data.source='array_record:data/corpus-llama2/train-*.array_record'` (without
it the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-16`, recorded in
experiments/dryrun/repro_width_depth_ladder.paper.v5p-16.json; 97-133M parameters, 8-way
data parallel, 32 sequences per chip, float32): with the 32,000 vocabulary v5p-16 no longer
holds the whole ladder as configured (v5p-32 not compiled). Pre-LN fits up to L48 (peak 38.4
GiB at d1152 L6 to 70.6 GiB at d384 L48); the TPU compiler refuses Pre-LN L96 (104.0 GB of
temporaries against 95.7 GB of HBM per chip; with `model.remat=nothing_saveable` 13.5 GiB).
Hyper-Connections fit at L6 and L12 (61.4 and 79.3 GiB); L24 compiles to 95.6 GiB, above the
88.5 GiB usable (17.0 GiB with remat); from L48 (HC_REMAT_DEPTH) the ladder sets remat (23.8
and 30.2 GiB at L48 and L96). AttnRes and DenseFormer carry every earlier block's output
through the layer scan; their scan saves only each block's input and rebuilds that history
in the backward pass, recomputing each block (history_scan in
depthscale/model/transformer.py), so their memory is O(L d), not O(L^2 d): AttnRes 26.0 GiB
at L6 to 80.0 GiB at L96, DenseFormer 13.4 to 31.1 GiB.
Each step compiled in at most 772 s on the 2-core host with other jobs running (load average
3-13), but for one: Pre-LN L24's statistics step took 2,933 s.
TPU dry run on v5p-16: not every rung fits (peak 95.6 GiB of 88.5 GiB per chip); estimated
step 0.0769-0.748 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=4`, recorded in
experiments/dryrun/repro_width_depth_ladder.paper.h100-8x4.json; 97-133M parameters): four
nodes are the fewest that hold the ladder as configured, 32-way data parallel (8 sequences
per GPU); on two nodes the Pre-LN L96 rung's peak was 93.6 GiB already with the byte
vocabulary (not re-recorded: LLaMA's vocabulary only adds to it). Per-GPU peaks: Pre-LN
16.7 to 57.3 GiB, Hyper-Connections 22.5 to 39.5 GiB (5.8 and 7.8 GiB at L48 and L96 with
remat), AttnRes 8.7 to 14.9 GiB, DenseFormer 6.5 to 10.0 GiB. model.dtype=float32, so XLA's
attention runs (cuDNN fuses bf16 / f16). XLA-GPU (jax 0.10.2) refuses the 2-layer cost
probes of 10 of the 20 rungs (every AttnRes rung among them) with Triton's GEMM fusions;
their cost comes from probes compiled with cuBLAS matmuls (dryrun.PROBE_FALLBACK), whose
FLOPs XLA does not count, so their estimate uses the analytic FLOPs. Each step compiled in
at most 109 s on the 2-core host with other jobs running (load average 5.5-7).
GPU dry run on 4 h100-8 nodes: every rung fits (peak 57.3 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.0231-0.128 s (roofline estimate, not measured).
"""

import dataclasses

from depthscale.natural_text import TextSizes
from depthscale.ladder import Rung, budget_sweep, cross
from depthscale.experiment import LLAMA_BLOCK, LLAMA_VOCAB, study_config

# name -> (budget, depths, head_dim, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (400_000, [2, 8, 32], 16, 32, 8, 60, 1, 20),
    'cpu': (400_000, [2, 8, 32], 16, 64, 16, 300, 3, 50),
    'paper': (100_000_000, [6, 12, 24, 48, 96], 64, 1024, 256, 20000, 1, 500),
}
BASELINE = {'pre_ln': {'model.block': 'pre_ln', 'model.residual': 'standard'}}
DESIGNS = {  # residual-stream designs, one seed each (all Pre-LN blocks)
    'hyper_connections': {'model.residual': 'hyper_connections'},
    'attn_res': {'model.residual': 'attn_res'},
    'denseformer': {'model.residual': 'denseformer'},
}
# the paper size's LLaMA block; SwiGLU at 8/3 d keeps GELU-4d's 12 d^2 block matrices, so
# the budget gives the same shapes
PAPER_MODEL = {**LLAMA_BLOCK, 'vocab_size': LLAMA_VOCAB}
PAPER_MLP = {'mlp': LLAMA_BLOCK['mlp'], 'mlp_ratio': 8 / 3}
HC_REMAT_DEPTH = 48  # Hyper-Connections from this depth on: model.remat=nothing_saveable


def _remat_deep_hc(rung: Rung) -> Rung:
  """The rung with full remat where Hyper-Connections' 4 streams per layer exceed the chip."""
  o = rung.overrides
  if o.get('model.residual') != 'hyper_connections' or o['model.num_layers'] < HC_REMAT_DEPTH:
    return rung
  return dataclasses.replace(rung, overrides={**o, 'model.remat': 'nothing_saveable'})


def get_config(arg: str | None = None):
  *_, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      **(PAPER_MODEL if arg == 'paper' else {}))


def get_ladder(arg: str | None = None):
  budget, depths, head_dim, *_, seeds, _ = SIZES[arg or 'cpu']
  shapes = budget_sweep(budget, depths, head_dim=head_dim, **(PAPER_MLP if arg == 'paper' else {}))
  if arg == 'smoke':  # the designs at the middle shape only
    shapes_for_designs = shapes[len(shapes) // 2:len(shapes) // 2 + 1]
  else:
    shapes_for_designs = shapes
  return (cross(BASELINE, cross({f's{s}': {'train.seed': s} for s in range(seeds)}, shapes))
          + [_remat_deep_hc(r) for r in cross(DESIGNS, cross({'s0': {}}, shapes_for_designs))])


# `smoke-text`, `cpu-text`: Pre-LN at every shape (smoke-text: d128 L2 only), seed 0, on the
# built-in python_docs corpus (English prose, byte tokens), evaluated at every quarter of
# the steps (depthscale.natural_text). cpu-text trains 307,200 tokens: 0.77-0.78 tokens per
# non-embedding parameter. Measured at cpu-text (seed 0, 159-268 s per rung beside other
# jobs at load average 11-13), eval loss at 50% / 100% of the steps: d128 L2 2.36 / 2.02,
# d64 L8 2.59 / 2.28, d32 L32 3.06 / 2.82; the same order at both points, as on the
# synthetic mix (one seed: an order, not a ranking by intervals).
TEXT = TextSizes({'smoke': ('pre_ln_d128_L2',), 'cpu': ('pre_ln',)})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
