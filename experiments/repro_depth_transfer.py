"""Hyperparameter transfer across depth: a coordinate check and an LR sweep over a depth
ladder under the standard parametrization, depth-muP (branches times (L/L0)^-1/2) and
CompleteP ((L/L0)^-1, hidden Adam LR unchanged). Backs notebooks/depth_transfer.py.

Run (arg = smoke | cpu | paper | tokens20, or smoke-text | cpu-text for the sweep on natural
text; default cpu):
  python -m depthscale.main --config=experiments/repro_depth_transfer.py:cpu --workdir=runs/depth_transfer
  python -m depthscale.coord_check --config=experiments/repro_depth_transfer.py:cpu --vary=num_layers \
      --values=2,4,8,16 --out=runs/coord --config.model.parametrization=completep

Runtime: see notebooks/depth_transfer.py and the README (cpu: 3 parametrizations x 4
depths x 4 learning rates, d32, 200 steps).
Expected result (measured, cpu): after a few steps the last block's activation RMS grows
with depth under the standard parametrization and stays flat under depth-muP and
CompleteP (the coordinate check); the best learning rate per depth is reported.
Measured at cpu-text (seed 0, 48 rungs in 52 min, 27-116 s each, one at a time beside other
jobs at load average 4-9), the best of the 4 rates at L 2 / 4 / 8 / 16: standard 3e-3, 3e-3,
1e-2, 3e-3; depth-muP 3e-3, 3e-2, 3e-2, 3e-2; CompleteP 3e-3, 3e-2, 3e-3, 3e-3 (final eval
loss at the best 2.858, 2.609, 2.802, 2.850); one seed per point, so a move of the best
rate is not separated from seed noise (notebooks/depth_transfer.py, section 5).
Size tokens20 (rows of docs/claims.md, kept in records/repro_depth_transfer.tokens20.json.gz):
depth-muP and CompleteP at d16 (1 head), L 2 / 4 / 8, rates 1e-3, 3e-3, 1e-2, 3e-2, 1e-1,
seeds 0-2, each depth trained 20 tokens per non-embedding parameter of python_docs (124 / 248
/ 495 steps of 16 x 64 tokens): 90 rungs through the launcher (two at a time), 24 of them in
15 min beside a CI run, the other 66 in 85 min beside the method survey's tokens20 ladder at
a lower priority. At L 2 = L0 the two parametrizations are the same model (equal losses).
Measured (final eval loss, mean over 3 seeds), the best rate at L 2 / 4 / 8 and the rates
tied with it (paired per-seed differences not separated from 0; the rule of the claims
rows): depth-muP 1e-2 (3.195), 1e-2 (2.804), 1e-1 (2.214), tied sets {1e-2, 3e-2}, {1e-2,
3e-2, 1e-1}, {1e-2, 3e-2, 1e-1}: 1e-2 and 3e-2 at every depth (reproduces; its L8 seeds at 1e-1
spread from 2.13 to 2.34, which widens its tied sets). CompleteP 1e-2 (3.195), 3e-2
(2.816), 1e-1 (2.176), tied sets {1e-2, 3e-2}, {1e-2, 3e-2, 1e-1}, {1e-1}: at L 8 1e-1 is
below 3e-2 on every seed (2.18 against 2.23), so its optimum moves up one grid step with
depth (does not at this size), and 1e-1 is the grid's highest rate at L 8, where it may lie
beyond.
Paper size: d 1024, 16 heads, T 2048, depths 2-128, with GPT-2's 50,257-token BPE
vocabulary padded to 50,304. CompleteP (Dey et al. 2025) trains pre-LN GPT-style models of
depth 2-128 on SlimPajama (its 1.5B non-embedding models at 20 tokens per parameter). The
authors' minimal code, the completep branch of EleutherAI/nanoGPT-mup (read here in a
co-author's fork, clairez-cerebras/nanoGPT-mup: model.py, train.py and its SlimPajama config
config/slimpj_h256_d6_*.py), is nanoGPT with LayerNorm, a GELU 4d MLP, RoPE, a tied head and
GPT-2's vocabulary (50,304); that config trains at T 2048, lr 2^-8 at base width 256, AdamW
eps 1e-16, weight decay 0.344, a linear warmup over 10% of the steps then linear decay to 0.
The paper's own runs' token counts and learning rates are not known from what was read.
This size: the same block (the model defaults), 256 sequences x 20,000 steps (10.5B tokens),
an LR sweep 2^-4 ... 2^-11, 2,000 warmup steps then cosine to 10%, AdamW with weight decay
0.1. Data: SlimPajama (`cerebras/SlimPajama-627B`) tokenized with GPT-2's tokenizer.json
(supplied by the user):
  python -m depthscale.data.prepare --input='SlimPajama-627B/train/chunk*/*.jsonl.zst' \
      --output=data/slimpj-gpt2 --tokenizer=PATH/tokenizer.json --workers=8
then `--config.data.source='array_record:data/slimpj-gpt2/train-*.array_record'` (without
it the paper size trains on the synthetic mix).
Paper size on TPU (`--dry_run --topology=v5p-256`, recorded in
experiments/dryrun/repro_depth_transfer.paper.v5p-256.json; 168 rungs, 21 distinct programs: 3
parametrizations x depths 2-128 at d1024, 76.7M-1.66B parameters, 128-way data parallel,
float32, no remat): v5p-256 is the smallest v5p slice that holds the whole ladder as
configured. The L128 rungs decide it; per-chip memory grows linearly with depth (peak 36.2
GiB at L64, 69.8 GiB at L128) and differs by under 0.5% between the parametrizations.
Measured on smaller slices with the byte vocabulary and not recorded (GPT-2's vocabulary only
adds to these): on v5p-128 the TPU compiler refused completep L128 (97.67 GB of temporaries
against 95.74 GB of HBM per chip; `model.remat=nothing_saveable` would fit at 36.5 GiB), and
on v5p-64 L128 needed 168 GB of temporaries (remat: 44.1 GiB). MFU estimate 46-66%. Each step
compiled in at most 288 s on the 2-core host with other jobs running (load average 3-13).
TPU dry run on v5p-256: every rung fits (peak 69.8 GiB of 88.5 GiB per chip); estimated step
0.00695-0.255 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 --num_nodes=2
--config.model.remat=nothing_saveable`, recorded in
experiments/dryrun/repro_depth_transfer.paper.h100-8x2.json, which keeps the flag): on GPUs
this ladder needs remat. As configured (no remat) no node count holds its L128 rungs:
with the byte vocabulary (measured, not recorded; GPT-2's vocabulary only adds to these
peaks) the standard L128 rung's peak was 186.9 GiB per GPU on 16 nodes and 106.5 GiB on 32
(one sequence per GPU, the most a batch of 256 allows). With every block rematerialized (the
backward recomputes each block from its saved input, about one more forward pass) two nodes
are the fewest, 16-way data parallel; on one node, with remat, the completep L128 rung's
peak was 92.8 GiB (byte vocabulary). Per-GPU peak 25.5 GiB at L2 to 59.4 GiB at L128 (18.6
GiB of it float32 parameters and Adam moments), the same for the three parametrizations. No
cheaper named policy saved more and fit (byte vocabulary): dots_with_no_batch_dims_saveable
compiled to the same peak as full remat (the block's projections are custom-VJP matmuls,
ops.matmul, which the dot policies do not see, so it keeps nothing more), and dots_saveable
(checkpoint_dots) also keeps the attention scores: 582.5 GiB. The TPU record above is of the
ladder without remat. model.dtype=float32, so XLA's attention runs; XLA's cost model counts
28-85% of the analytic FLOPs of the GPU program, so the estimate uses the analytic count,
which leaves out the recomputation; the bytes XLA counts bound the estimated step (MFU
estimate 31%). Each step compiled in at most 46 s on the 2-core host with other jobs running
(the 21 distinct programs' steps: 15 minutes of compile).
GPU dry run on 2 h100-8 nodes with model.remat=nothing_saveable: every rung fits (peak 59.4
GiB of 71.2 GiB usable per GPU; XLA's attention); estimated step 0.0535-1.39 s (roofline
estimate, not measured).
"""

from depthscale.experiment import GPT2_VOCAB, study_config
from depthscale.ladder import Rung, block_params
from depthscale.natural_text import TextSizes

L0 = 2  # base depth: every parametrization agrees at L = L0
# name -> (D, heads, coord-check depths, sweep depths, learning rates, parametrizations,
#          seq_len, batch, steps, log_every)
SIZES = {
    'smoke': (32, 1, [2, 16], [8], [1e-2], ('standard', 'depth_mup', 'completep'), 32, 8, 20, 10),
    'cpu': (32, 1, [2, 4, 8, 16], [2, 4, 8, 16], [1e-3, 3e-3, 1e-2, 3e-2],
            ('standard', 'depth_mup', 'completep'), 64, 16, 200, 50),
    # python_docs at 20 tokens per non-embedding parameter at every depth (steps per depth)
    'tokens20': (16, 1, [2, 4, 8], [2, 4, 8], [1e-3, 3e-3, 1e-2, 3e-2, 1e-1], ('depth_mup', 'completep'),
                 64, 16, 495, 20),  # steps: L8's; each depth's own in _steps
    'paper': (1024, 16, [2, 8, 32, 128], [2, 4, 8, 16, 32, 64, 128], [2 ** -k for k in range(4, 12)],
              ('standard', 'depth_mup', 'completep'), 2048, 256, 20000, 500),
}
PAPER_MODEL = {'vocab_size': GPT2_VOCAB}  # the GPT-2 tokenizer of the CompleteP code


def get_config(arg: str | None = None):
  d_model, heads, *_, seq_len, batch, steps, log_every = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=log_every,
                   d_model=d_model, num_heads=heads, num_layers=L0, base_num_layers=L0,
                   **(PAPER_MODEL if arg == 'paper' else {}))
  c.optim.lr = 1e-2
  if arg == 'tokens20':
    c.data.source, c.data.eval_batches = 'python_docs', 8
  return c


SEEDS = {'tokens20': 3}  # seeds per point (data order and init); other sizes: seed 0
TOKENS_PER_PARAM, NORM_SHARE = 20, 1.03  # norm gains and biases: ~2-3% beyond block_params


def _steps(arg: str, depth: int) -> dict:
  """tokens20: the steps that give each depth TOKENS_PER_PARAM tokens per parameter, with
  study_config's recipe at that length (one eval and checkpoint at the end, 10% warmup)."""
  if arg != 'tokens20':
    return {}
  d_model, _, _, _, _, _, seq_len, batch, *_ = SIZES[arg]
  params = block_params(d_model, depth) * NORM_SHARE
  steps = -(-int(TOKENS_PER_PARAM * params) // (seq_len * batch))
  return {'train.steps': steps, 'train.eval_every': steps, 'train.checkpoint_every': steps,
          'optim.warmup_steps': steps // 10}


def get_ladder(arg: str | None = None):
  arg = arg or 'cpu'
  _, _, _, depths, lrs, params, *_ = SIZES[arg]
  return [Rung(f'{p}_s{k}_L{l}_lr{lr:g}', {'model.parametrization': p, 'model.num_layers': l,
                                           'optim.lr': lr, 'train.seed': k, **_steps(arg, l)})
          for k in range(SEEDS.get(arg, 1)) for p in params for l in depths for lr in lrs]


# `<size>-text`: the whole sweep (every parametrization, depth and rate, seed 0) on the
# built-in python_docs corpus, evaluated at every quarter of the steps (depthscale.natural_text).
# cpu-text trains 204,800 tokens: 1-8.2 tokens per non-embedding parameter (L 16 to L 2)
TEXT = TextSizes({size: SIZES[size][5] for size in ('smoke', 'cpu')})
get_config, get_ladder = TEXT.offer(get_config, get_ladder)
