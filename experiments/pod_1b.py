"""The 1B rung for a TPU pod: a Pre-LN LLaMA-3.2-1B-shaped model (d_model 2048, 16 layers,
32 query and 8 KV heads, SwiGLU 8192, RMSNorm, RoPE, tied embeddings) with GPT-2's
vocabulary padded to 50304, T 2048, global batch 256 sequences (0.5M tokens per step),
bf16 compute, fully sharded over every chip (mesh.fsdp=-1, as MaxText's default).

Run (on every host of the pod, `--workdir` a shared path; docs/scaling.md):
  python -m depthscale.main --config=experiments/pod_1b.py --workdir=gs://BUCKET/runs/pod_1b \
    --multi_host --config.data.source='array_record:/data/c4-gpt2/train-*.array_record'

Without `data.source` it trains on the embedded synthetic mix (its 235 tokens use the
first rows of the vocabulary); docs/data.md turns a corpus dump into token shards.
Runtime: not run here (no TPU); the dry run below estimates the step time: 20,000 steps
(10B tokens) at 0.26 s would take about 1.4 h on v5p-64 (estimate).
Expected result: a baseline for the pod recipe, not a paper's claim: the Pre-LN loss of a
1B model and its per-layer metrics, against which the norm-placement and residual-design
rungs of the same shape are compared.
On TPU (`--dry_run --topology=v5p-64`, recorded in experiments/dryrun/pod_1b.v5p-64.json):
1,076.2M parameters (973.1M outside the embedding), 32-way fsdp, 8 sequences per chip.
v5p-64 is the smallest v5p slice that holds it as configured: on v5p-32 the peak is 92.3
GiB per chip (16 sequences per chip), and `model.remat=nothing_saveable` would fit it there
at 14.7 GiB. XLA's cost analysis counts only 16% of the analytic FLOPs of this mesh, so the
estimate rests on the analytic count.
TPU dry run on v5p-64: every rung fits (peak 46.4 GiB of 88.5 GiB per chip); estimated step
0.259 s (roofline estimate, not measured).
On H100 nodes (`--dry_run --topology=h100-8 [--num_nodes=2]`, recorded in
experiments/dryrun/pod_1b.h100-8x1.json and experiments/dryrun/pod_1b.h100-8x2.json), both
steps run cuDNN's fused attention; as configured, the activations of 32 (one node) or 16
(two nodes) sequences per GPU exceed the 71.2 GiB XLA may use of an H100, and
`model.remat=nothing_saveable` fits them at 31.4 GiB (one node) or 15.8 GiB (two nodes).
GPU dry run on 1 h100-8 node: not every rung fits (peak 154.8 GiB of 71.2 GiB usable per GPU;
cuDNN's fused attention); estimated step 0.481 s (roofline estimate, not measured).
GPU dry run on 2 h100-8 nodes: not every rung fits (peak 77.5 GiB of 71.2 GiB usable per GPU;
cuDNN's fused attention); estimated step 0.241 s (roofline estimate, not measured).
"""

from depthscale.experiment import GPT2_VOCAB, study_config


def get_config(arg: str | None = None):
  del arg
  c = study_config('paper', seq_len=2048, batch=256, steps=20000, log_every=100,
                   num_layers=16, d_model=2048, num_heads=32, num_kv_heads=8, d_ff=8192,
                   vocab_size=GPT2_VOCAB, mlp='swiglu', norm='rmsnorm', dtype='bfloat16')
  c.train.eval_every = c.train.checkpoint_every = 1000
  c.mesh.data, c.mesh.fsdp = 1, -1
  return c
