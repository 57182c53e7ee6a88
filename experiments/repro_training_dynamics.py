"""Training-dynamics methods seen through per-layer metrics: ProRes (progressive residual
warmup, deeper blocks later), LayerDrop (random block skipping) and LayerSkip (depth-
increasing layer dropout plus an early-exit loss). Backs notebooks/training_dynamics.py.

Run (arg = smoke | cpu | paper | smoke-text | cpu-text; default cpu):
  python -m depthscale.main --config=experiments/repro_training_dynamics.py:cpu --workdir=runs/training_dynamics

`smoke-text` and `cpu-text` train seed 0 of Pre-LN, ProRes, LayerDrop and LayerSkip
(smoke-text: ProRes only) on the built-in `python_docs` corpus (English prose, byte
tokens) instead of the synthetic mix, evaluated at every quarter of the steps
(depthscale.natural_text). cpu-text trains 307,200 tokens: 0.78 tokens per non-embedding
parameter. Measured at cpu-text (seed 0, lr 3e-3, beside other jobs, load average up to 9.5),
eval loss at 50% / 100% of the steps: LayerSkip 2.57 / 2.31, Pre-LN 2.60 / 2.32, LayerDrop
2.95 / 2.77, ProRes 3.12 / 2.91; the same order at both points (one seed at one rate: an
order, not a ranking by intervals; experiments/method_survey.py has each at its best rate).

Runtime: see notebooks/training_dynamics.py and the README (cpu: 6 variants x 3 seeds,
L8 d64, 300 steps).
Expected result (measured, cpu): under ProRes the deep blocks' update ratio stays near 0
until their warmup starts; LayerDrop makes skipping a single block cost less loss (than
Pre-LN, and at the cpu size than pre_ln_quarter, Pre-LN trained a quarter as long to
about LayerDrop's loss: the undertraining control);
LayerSkip brings the early layers' logit-lens predictions closer to the final ones, and
closer than its control layerskip_no_exit (the same layer dropout without the early-exit
loss) at the smoke and cpu sizes. Final eval loss at cpu, mean of 3 seeds at lr 3e-3 (one rung
at a time beside other jobs, load average 5.8-7.1; 28 min): LayerSkip 2.342, its control
2.348, Pre-LN 2.349, ProRes 2.414, LayerDrop 2.754, pre_ln_quarter 2.757 (the claims'
intervals: notebooks/training_dynamics.py).
Paper size: ProRes' LLaMA-350M (configs/llama_350m.json of dandingsky/ProRes: 24 layers,
d 1024, 16 heads, SwiGLU width 2736, RMSNorm eps 1e-5, RoPE, vocabulary 32,000), T 1024.
ProRes' recipe, from its code (torchrun_main.py, scripts/run_350m.sh): C4 (`allenai/c4`,
en) tokenized with Llama-2's SentencePiece tokenizer, 512 sequences x 100,000 steps (52.4B
tokens), AdamW (0.9, 0.95) at lr 1e-3, weight decay 0.1, clip 1.0, 2,000 warmup steps then
WSD, ProRes warmup 24,000 steps. LayerDrop's and LayerSkip's corpora and recipes are not
known from what was read. This size: 256 sequences x 20,000 steps (5.2B tokens), lr 3e-3
(the optim default), 2,000 warmup steps then cosine to 10%, ProRes over 10,000 steps. Data:
a C4 dump tokenized with Llama-2's tokenizer.model (supplied by the user), then
  python -m depthscale.data.prepare --input='c4/en/c4-train.*.json.gz' --output=data/c4-llama2 \
      --tokenizer=PATH/tokenizer.model --workers=8
  python -m depthscale.main --config=experiments/repro_training_dynamics.py:paper \
      --workdir=runs/training_dynamics_paper \
      --config.data.source='array_record:data/c4-llama2/train-*.array_record'
(without data.source the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-32`, recorded in
experiments/dryrun/repro_training_dynamics.paper.v5p-32.json): v5p-32 is the smallest v5p
slice that holds the ladder as configured, 16-way data parallel; on v5p-16 (32 sequences per
chip) the Pre-LN rung's peak is 98.3 GiB (`model.remat=nothing_saveable` would fit it at
14.8 GiB); 335.2M parameters per rung (32.8M of them the embedding).
MFU estimate 60%. TPU dry run on v5p-32: every rung fits (peak 52.3 GiB of 88.5 GiB per
chip); estimated step 0.137 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=4`, recorded in
experiments/dryrun/repro_training_dynamics.paper.h100-8x4.json): four nodes hold the ladder,
32-way data parallel (8 sequences per GPU); fewer nodes were not compiled for this model (with
the byte vocabulary and a GELU MLP, two nodes did not hold the Pre-LN rung: 79.5 GiB).
model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16). XLA-GPU (jax 0.10.2)
finds no Triton tile sizes for the fused SwiGLU input projection in the 2-layer cost probe
(f32[5472,8192]); the probes are compiled with cuBLAS matmuls (dryrun.PROBE_FALLBACK), whose
FLOPs XLA's cost model does not count, so the estimate uses the analytic FLOPs; it is likely
too low, since the bytes XLA counts then seem to leave out the matmuls' as well (see
repro_curse_of_depth.py).
GPU dry run on 4 h100-8 nodes: every rung fits (peak 50.4 GiB of 71.2 GiB usable per GPU;
XLA's attention); estimated step 0.0546 s (roofline estimate, not measured).
"""

from depthscale.ladder import Rung, cross
from depthscale.experiment import LLAMA_BLOCK, LLAMA_VOCAB, study_config
from depthscale.natural_text import TextSizes

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (6, 32, 1, 32, 8, 60, 1, 5),
    'cpu': (8, 64, 2, 64, 16, 300, 3, 10),
    'paper': (24, 1024, 16, 1024, 256, 20000, 1, 200),  # ProRes' LLaMA-350M shape
}
# the paper size's LLaMA block: ProRes' configs/llama_350m.json (SwiGLU width, RMSNorm eps)
PAPER_MODEL = {**LLAMA_BLOCK, 'd_ff': 2736, 'norm_eps': 1e-5, 'vocab_size': LLAMA_VOCAB}


def variants(arg: str | None) -> dict[str, dict]:
  """Baseline Pre-LN and the three methods; ProRes warms up over the first half."""
  steps = SIZES[arg or 'cpu'][5]
  return {
      'pre_ln': {},
      'prores': {'train.prores': 'linear', 'train.prores_warmup_steps': steps // 2},
      'layerdrop': {'train.layerdrop': 0.2},
      'layerskip': {'train.layerskip_p_max': 0.2, 'train.early_exit_scale': 0.1},
      # control: LayerSkip's layer dropout without its early-exit loss
      'layerskip_no_exit': {'train.layerskip_p_max': 0.2, 'train.early_exit_scale': 0.0},
      # control: Pre-LN trained a quarter as long, to about LayerDrop's loss (cpu size)
      'pre_ln_quarter': {'train.steps': steps // 4},
  }


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  return study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                      analyses=True,  # the skip-layer and logit-lens analyses
                      num_layers=num_layers, d_model=d_model, num_heads=heads,
                      **(PAPER_MODEL if arg == 'paper' else {}))


def get_ladder(arg: str | None = None):
  seeds = SIZES[arg or 'cpu'][6]
  return cross(variants(arg), [Rung(f's{s}', {'train.seed': s}) for s in range(seeds)])


# `<size>-text` (see the top): seed 0, the methods without the controls
TEXT = TextSizes({'smoke': ('prores',), 'cpu': ('pre_ln', 'prores', 'layerdrop', 'layerskip')})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
