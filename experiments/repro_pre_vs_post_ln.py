"""On Layer Normalization in the Transformer (Xiong et al. 2020): with Xavier init,
a large learning rate and no warmup, Post-LN stalls while Pre-LN trains; gradient-norm
profiles at init differ by norm placement. Backs notebooks/pre_vs_post_ln.py.

Run (arg = smoke | cpu | paper, or deep_smoke | deep_cpu | deep_paper for the very deep,
tiny-width ladder of every placement, or smoke-text | cpu-text; default cpu):
  python -m depthscale.main --config=experiments/repro_pre_vs_post_ln.py:cpu --workdir=runs/pre_vs_post_ln

`smoke-text` and `cpu-text` train seed 0 of every variant (smoke-text: Pre-LN only)
on the built-in `python_docs` corpus (English prose, byte tokens) instead of the synthetic
mix, evaluated at every quarter of the steps (depthscale.natural_text). cpu-text trains
204,800 tokens: 0.34-0.35 tokens per non-embedding parameter. Measured at cpu-text (seed 0,
Xiong et al.'s lr 3e-3 without warmup, 207-409 s per rung beside other jobs at load average
11-13), eval loss at 50% / 100% of the steps: Keel 2.71 / 2.24, Pre-LN 3.20 / 2.63, Mix-LN
3.354 / 3.24, DeepNorm 3.353 / 3.346, Post-LN with a 50-step warmup 3.353 / 3.351, Post-LN
3.352 / 3.354. Keel and Pre-LN lead at both points; the Post-LN family sits on a plateau
(their 50% order is in the third decimal, noise), from which only Mix-LN leaves by 100%
(one seed at one rate: an order, not a ranking by intervals; experiments/method_survey.py
has each at its best rate).

Runtime: cpu: 18 rungs (L12 d64, 200 steps) + 6 deep rungs (deep_cpu, L256 d16): the whole
notebook took 43 min on the 2-core machine with two other notebooks running. smoke: 2 rungs
+ 2 deep rungs of L16 d16.
Expected result (measured, cpu, Xavier init, 3 seeds): without warmup Post-LN plateaus at
eval loss 3.72 +- 0.02 (not a NaN; the unigram entropy is 4.39) while Pre-LN reaches
2.48 +- 0.09; a 50-step warmup does not rescue Post-LN here (3.72 +- 0.02), nor does
DeepNorm (3.72); Keel trains (2.37), Mix-LN partly (3.20). Grad norm at init, last / first
block: Post-LN 1.08 +- 0.19, Pre-LN 0.23 +- 0.03; after training Post-LN's first block
gets ~1e-7 of its last block's gradient.
Paper size: a Transformer-base-shaped decoder (6 layers, d 512, 8 heads, T 256; deep_paper:
1,000 layers) with GPT-2's 50,257-token BPE vocabulary padded to 50,304. Xiong et al. train
Transformer-base on IWSLT14 De-En and WMT14 En-De and BERT-base, Adam at lr up to 1e-3 with
and without a 4,000-step warmup (notebooks/pre_vs_post_ln.py; the abstract names translation
and BERT only); their vocabularies and token counts are not known from what was read, so
GPT-2's BPE stands in as a real tokenizer's vocabulary (not the paper's). This size: Xavier
init, lr 3e-3 constant without warmup (the setting whose Post-LN failure the paper explains),
256 sequences x 100,000 steps (6.6B tokens). Data: a corpus tokenized with GPT-2's
tokenizer.json (supplied by the user):
  python -m depthscale.data.prepare --input='CORPUS/*.jsonl' --output=data/corpus-gpt2 \
      --tokenizer=PATH/tokenizer.json --workers=8
then `--config.data.source='array_record:data/corpus-gpt2/train-*.array_record'` (without it
the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-8`, recorded in
experiments/dryrun/repro_pre_vs_post_ln.paper.v5p-8.json): v5p-8 is the smallest v5p slice;
44.6-44.7M parameters per rung (25.8M of them the embedding), 4-way data parallel, MFU
estimate 42-52% (a small model: the step is bound by HBM traffic, 52-65 GB per chip).
TPU dry run on v5p-8: every rung fits (peak 10.8 GiB of 88.5 GiB per chip); estimated step
0.0189-0.0236 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8`, recorded in
experiments/dryrun/repro_pre_vs_post_ln.paper.h100-8x1.json): one node holds the ladder,
8-way data parallel, MFU estimate 17-19% (bound by HBM traffic, 41-45 GB per GPU);
model.dtype=float32, so XLA's attention runs (cuDNN fuses bf16 / f16).
GPU dry run on 1 h100-8 node: every rung fits (peak 6.7 GiB of 71.2 GiB usable per GPU; XLA's
attention); estimated step 0.0122-0.0133 s (roofline estimate, not measured).
"""

from depthscale.ladder import Rung, cross
from depthscale.experiment import GPT2_VOCAB, study_config
from depthscale.natural_text import TextSizes

# name -> (L, D, heads, seq_len, batch, steps, seeds, log_every)
SIZES = {
    'smoke': (12, 64, 2, 32, 8, 200, 1, 10),
    'cpu': (12, 64, 2, 64, 16, 200, 3, 10),
    'paper': (6, 512, 8, 256, 256, 100000, 1, 500),  # ~Transformer-base decoder, IWSLT-like scale
    # very deep and tiny: which placements still train (lr 1e-3 with a 10% warmup)
    'deep_smoke': (16, 16, 1, 32, 8, 20, 1, 10),
    'deep_cpu': (256, 16, 1, 32, 16, 200, 1, 20),
    'deep_paper': (1000, 512, 8, 256, 256, 50000, 1, 500),  # DeepNet's 1,000 layers
}
PLACEMENTS = {
    'post_ln': {'model.block': 'post_ln'},
    'pre_ln': {'model.block': 'pre_ln'},
}
FIXES = {  # not in the smoke ladder
    'post_ln_warmup': {'model.block': 'post_ln', 'optim.warmup_steps': 50},
    'deepnorm': {'model.block': 'deepnorm', 'model.init': 'deepnorm'},  # Xavier, gain (8L)^-1/4
    'keel': {'model.block': 'keel'},
    'mix_ln': {'model.block': 'mix_ln'},
}
DEEP = ('post_ln', 'pre_ln', 'mix_ln', 'deepnorm', 'keel', 'peri_ln')  # smoke: the first two


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, _, log_every = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                   num_layers=num_layers, d_model=d_model, num_heads=heads)
  if (arg or '').endswith('paper'):  # paper and deep_paper
    c.model.vocab_size = GPT2_VOCAB
  if (arg or '').startswith('deep'):  # GPT-style init (DeepNorm brings its own), lr 1e-3
    c.optim.lr = 1e-3
    return c
  c.model.init = 'xavier'  # Xiong et al.'s setting: Glorot normal on the block matrices
  c.optim.lr, c.optim.warmup_steps, c.optim.schedule = 3e-3, 0, 'constant'
  return c


def get_ladder(arg: str | None = None):
  arg = arg or 'cpu'
  seeds = [Rung(f's{s}', {'train.seed': s}) for s in range(SIZES[arg][6])]
  if arg.startswith('deep'):
    names = DEEP[:2] if arg == 'deep_smoke' else DEEP
    return cross({n: {'model.block': n} for n in names}, seeds)
  return cross(PLACEMENTS if arg == 'smoke' else {**PLACEMENTS, **FIXES}, seeds)


# `<size>-text` (see the top): seed 0, every variant (smoke: Pre-LN)
TEXT = TextSizes({'smoke': ('pre_ln',), 'cpu': tuple({**PLACEMENTS, **FIXES})})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
