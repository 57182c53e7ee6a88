"""The post-hoc depth studies on a pretrained model: a Hugging Face checkpoint directory of
GPT-2, Llama, Mistral or Qwen2 (depthscale.hf; docs/methods.md has the table of what maps)
in place of a depthscale rung, as the papers ran them.

Run (CHECKPOINT: a local directory with config.json and safetensors, e.g. a
`huggingface-cli download meta-llama/Llama-2-7b-hf` or `openai-community/gpt2` snapshot;
nothing is downloaded here):
  python -m depthscale.main --config=experiments/pretrained.py:CHECKPOINT --workdir=runs/pretrained
  python -m depthscale.posthoc.linear_maps --shallow=runs/pretrained/prune_n<k> \
    --deep=runs/pretrained/pretrained

Rungs, every one starting from the checkpoint (posthoc.init_from):
  pretrained: the checkpoint as it is (one step at learning rate 0, the warmup's first):
    its per-layer analyses at step 0 are skip-one-block (skip_delta_loss), the effective
    depths (cos, kl, overlap, skip), the logit lens (KL and top-5 overlap with the output),
    angular distances, Jacobian and attention statistics (depthscale.training.analysis), and
    its eval loss on the data.
  prune_n<k>: Gromov et al. 2024 (arXiv 2403.17887): drop the k = L/4 and L/2 consecutive
    blocks whose streams are closest in angle, then heal for HEAL_STEPS (prune_n0 the same
    fine-tune without pruning: the control).
  ln_free: Heimersheim 2024 (arXiv 2409.13710): every norm removed by fine-tuning, one per
    REMOVE_EVERY steps.
The linear maps across depth (Csordas et al. 2025, arXiv 2505.13898) then read two
finished rungs: the checkpoint (`pretrained`) and a pruned one, or two checkpoints' rungs.

Data: python_docs (English prose shipped with Python), tokenized with the checkpoint's own
tokenizer.json when the directory has one (else bytes, for test models of vocab >= 256);
a prepared corpus instead with --config.data.source='array_record:DIR/train-*.array_record'
(docs/data.md). The sequence length is SEQ_LEN or the checkpoint's limit if lower.

Without an argument the checkpoint is Llama-2-7B's config.json (experiments/hf_configs/,
no weights): enough for the dry run, not for training. For d_model >= 2048 the config
computes in bfloat16, rematerializes every block and shards the parameters over every chip.

Runtime: a 4-block GPT-2 of width 64 with random weights (transformers' GPT2Config,
n_positions 64, vocab 256, saved with save_pretrained; bytes as tokens) ran the whole
ladder in 9 minutes of wall time on a 2-core host shared with other jobs (load average ~5).
A 7B model needs a TPU slice or GPUs: `--dry_run --topology=v5p-16` without an argument
(Llama-2-7B, T 256, 8 sequences per step) is recorded in
experiments/dryrun/pretrained.llama2_7b.v5p-16.json (the train steps; the analyses compile
separately): TPU dry run on v5p-16: every rung fits (peak 18.7 GiB of 88.5 GiB per chip);
estimated step 0.0186-0.0347 s (roofline estimate, not measured).
Measured there (seed 0, eval loss; a random model, so nothing here tests the papers'
claims, only that every study runs on an imported checkpoint): pretrained 5.4891 (effective
depths at step 0: kl 2, cos 1, overlap 0, skip 1 of 4 blocks); prune_n0 (control) 5.4891 ->
4.3619 after 200 healing steps; prune_n1 drops block 4 (angular distance 0.0866), 5.4881 ->
4.3633; prune_n2 drops blocks 3-4 (0.1199), 5.4864 -> 4.3827; ln_free (9 norms removed in
170 steps) 5.4891 -> 3.3716. Linear maps prune_n2 -> pretrained: held-out R^2 0.94-0.99,
best l'/L' 0, .25, .25 for l/L = 0, .5, 1.
Expected result (the papers' claims on their models): Llama-2 70B loses little until about
half of its deeper blocks are pruned and healed; GPT-2 small's loss barely moves without its
norms; the later blocks contribute little to the output (small skip_delta_loss there, the
logit-lens KL falling late); each layer of a shallower model is best predicted at the same
relative depth of a deeper one.
"""

import os

from depthscale import hf
from depthscale.hf import architectures
from depthscale.ladder import Rung

# Llama-2-7B's config.json (no weights): the default argument, and the dry run's model
LLAMA2_7B = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hf_configs', 'llama-2-7b')
LARGE_D_MODEL = 2048
SEQ_LEN = 256
HEAL_STEPS = 200
REMOVE_EVERY = 10
LR = 1e-4  # fine-tuning a pretrained model (Gromov et al. heal with QLoRA at 3e-4)


def get_config(arg: str | None = None):
  arg = arg or LLAMA2_7B
  limits = [v for _, v in architectures.seq_len_limits(hf.hf_config(arg))]
  c = hf.read_config(arg, min([SEQ_LEN] + limits))
  c.posthoc.init_from = arg
  c.data.source = 'python_docs'
  c.data.tokenizer = arg if hf.has_tokenizer(arg) else 'byte'
  c.data.batch_size, c.data.eval_batches = 8, 4
  c.metrics.analysis_batch_size = 4
  c.optim.lr, c.optim.weight_decay = LR, 0.0
  if c.model.d_model >= LARGE_D_MODEL:  # billions of parameters: bf16, fully sharded, remat
    c.model.dtype, c.model.remat = 'bfloat16', 'nothing_saveable'
    c.mesh.data, c.mesh.fsdp = 1, -1
  return _steps(c, 1, warmup=1)


def _steps(c, steps: int, warmup: int):
  """c training for `steps` steps (warmup from learning rate 0), logging, evaluating,
  checkpointing and analysing at the last."""
  c.train.steps, c.optim.warmup_steps = steps, warmup
  c.train.log_every = max(steps // 10, 1)
  c.train.eval_every = c.train.checkpoint_every = c.metrics.analysis_every = steps
  return c


def _fine_tune(steps: int, **overrides) -> dict:
  return {'train.steps': steps, 'optim.warmup_steps': steps // 10,
          'train.log_every': max(steps // 10, 1), 'train.eval_every': steps,
          'train.checkpoint_every': steps, 'metrics.analysis_every': steps, **overrides}


def get_ladder(arg: str | None = None):
  c = get_config(arg)
  layers = c.model.num_layers
  pruned = sorted({0, max(layers // 4, 1), layers // 2})
  norms = 2 * layers + 1  # Pre-LN: two per block and the final norm
  return ([Rung('pretrained', {})]
          + [Rung(f'prune_n{k}', _fine_tune(HEAL_STEPS, **{
              'model.num_layers': layers - k, 'posthoc.prune_layers': k})) for k in pruned]
          + [Rung('ln_free', _fine_tune((norms + 8) * REMOVE_EVERY, **{
              'posthoc.remove_norms_every': REMOVE_EVERY,
              'posthoc.remove_norms_start': 2 * REMOVE_EVERY}))])
