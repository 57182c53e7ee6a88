"""Default configuration: the one typed source of every field and its default."""

from __future__ import annotations

import jax
import ml_collections

from depthscale import data
from depthscale.errors import ConfigError
from depthscale.model import (inner_norms, norms, ops, parametrization, placements,
                              recurrence, residual, taper)
from depthscale.model.tables import rows_with
from depthscale.training import cpu_calibration, dynamics, optim, sharding, topology

ConfigDict = ml_collections.ConfigDict
__all__ = ['ConfigDict', 'ConfigError', 'default_config', 'validate']


def default_config() -> ConfigDict:
  """Returns the defaults; experiment files start from here and override."""
  c = ConfigDict()

  m = c.model = ConfigDict()
  m.num_layers = 4  # L, number of blocks
  m.d_model = 128  # D, residual width
  m.num_heads = 4  # H, query heads
  m.num_kv_heads = 0  # K, key/value heads (0 = num_heads; fewer = grouped-query attention)
  m.d_ff = 0  # MLP hidden width (0 = mlp_ratio * d_model)
  m.mlp_ratio = 4.0  # used when d_ff == 0
  m.vocab_size = 256  # V
  m.norm = 'layernorm'  # norm function: see depthscale.model.norms.NORMS
  m.norm_eps = 1e-5  # epsilon inside the norm's sqrt
  m.norm_bias = False  # rmsnorm / crmsnorm: a learnable bias after the gain, as LayerNorm has
  m.block = 'pre_ln'  # norm placement: see depthscale.model.placements.PLACEMENTS
  m.peri_embed_norm = False  # Peri-LN: norm the embedding output (AMBIGUOUS in the paper)
  m.mix_ln_alpha = 0.25  # Mix-LN: the first floor(alpha * L) blocks are Post-LN
  m.keel_alpha = 'sublayers'  # Keel skip multiplier: 'sublayers' (2L) or 'blocks' (L)
  m.normformer_head_scale = 'paper'  # NormFormer HeadScale: 'paper' (before W_O) or 'code' (after)
  m.normformer_resid_scale = False  # NormFormer: learnable lambda_resid on the MLP residual
  m.ln_scaling = False  # LayerNorm Scaling: pre-norm outputs times 1/sqrt(l), l 1-based
  m.gpas = False  # GPAS gate x - silu(a) * stop_grad(x), a init 0
  m.gpas_share_per_block = True  # GPAS: one gate per block (the code); False: one per sublayer
  m.qk_norm = 'none'  # 'none', 'full', 'per_head' or 'l2_learned_scale' (Henry et al.)
  m.qk_norm_seq_len = 0  # T of Henry's g0 = log2(T^2 - T) (0 = data.seq_len)
  m.layer_rope = False  # LayerRoPE (interpretation of the abstract): one rotated shared gain
  m.layer_rope_theta = 1.0  # LayerRoPE: rotation angle per block (times RoPE frequencies)
  m.layer_rope_base = 10000.0  # LayerRoPE: frequency base
  m.fix_norm = False  # FixNorm: unit-norm embedding rows times sqrt(D)
  m.norm_alpha_attn = 1.0  # DyT / Derf: initial alpha of the attention-input norms
  m.norm_alpha_mlp = 1.0  # DyT / Derf: initial alpha of the MLP-input norms
  m.norm_alpha_final = 1.0  # DyT / Derf: initial alpha of the final norm
  m.bhyt_lambda_in = 2.0  # BHyT: initial lambda of the attention-input norms
  m.bhyt_lambda_post = 1.0  # BHyT: initial lambda of the MLP-input norms
  m.bhyt_kappa = 10.0  # BHyT: kappa
  m.position = 'rope'  # 'rope' or 'learned'
  m.rope_base = 10000.0  # RoPE frequency base
  m.rope_scaling = 'none'  # RoPE frequencies of long-context checkpoints: 'none', 'linear' (/ factor) or 'llama3' (Llama 3.1's per-band rule)
  m.rope_scaling_factor = 1.0  # rope_scaling: the factor the (low) frequencies are divided by
  m.rope_low_freq_factor = 1.0  # rope_scaling='llama3': wavelengths above original_max_len / this are scaled
  m.rope_high_freq_factor = 4.0  # rope_scaling='llama3': wavelengths below original_max_len / this are kept
  m.rope_original_max_len = 8192  # rope_scaling='llama3': the context length of pre-training
  m.attn_bias = 'none'  # biases of the attention projections: 'none', 'qkv' (q, k, v: Qwen2) or 'all' (and the output: GPT-2)
  m.mlp_bias = False  # biases of both MLP matrices (GPT-2)
  m.mlp = 'gelu'  # 'gelu', 'relu', 'relu2' (squared ReLU; 2 matrices) or 'swiglu' (3 matrices)
  m.mlp_taper = 'none'  # MLP widths over depth, fixed budget: 'none', 'cosine' (wide first), 'reverse'
  m.mlp_taper_ratio = 1.5  # taper: first block's width / d_ff (the last block's is 2 - ratio)
  m.tie_embeddings = True  # LM head shares the token embedding
  m.init_std = 0.02  # std of the normal init of every matrix
  m.init = 'normal'  # init scheme: see depthscale.model.parametrization.INITS
  m.parametrization = 'standard'  # 'standard', 'mup', 'depth_mup', 'completep'
  m.base_d_model = 0  # muP base width (0 = d_model: m_N = 1)
  m.base_num_layers = 0  # depth-muP / CompleteP base depth (0 = num_layers: m_L = 1)
  m.output_mult = 1.0  # alpha_out: logits multiplier (divided by m_N under the muP family)
  m.dtype = 'float32'  # compute dtype; params and optimizer state stay float32
  m.remat = 'none'  # a jax.checkpoint_policies name, or 'none' (history designs always recompute)
  m.unroll_max_layers = -1  # layer scan unrolled (not on logging steps) for num_layers <= this; 0: never; -1: 16 on CPU, 0 on TPU / GPU
  m.attention_kernel = 'auto'  # 'auto' (splash on TPU, cudnn on GPU, blocked on CPU: by the mesh's devices), xla, blocked, cudnn, splash, splash_interpret
  m.residual = 'standard'  # residual-stream design: see depthscale.model.residual.DESIGNS
  m.hc_rate = 4  # hyper_connections / mhc: expansion rate n (number of streams)
  m.hc_dynamic = True  # hyper_connections: dynamic (input-dependent) HC, else static
  m.mhc_sinkhorn_iters = 20  # mhc: Sinkhorn-Knopp iterations t_max
  m.dwa_dilation = 1  # denseformer: dilation k (block i averages X_j with j = i mod k)
  m.dwa_period = 1  # denseformer: period p (a DWA after every p-th block; divides num_layers)
  m.attn_res_blocks = 8  # block_attn_res: number of source blocks N (<= 2 * num_layers)
  m.laurel = 'rw'  # laurel variant: 'rw', 'lr', 'pa' or 'rw_lr'
  m.laurel_rank = 4  # laurel lr / rw_lr: rank r of B A
  m.laurel_window = 2  # laurel pa: number k of previous sublayer inputs mixed in
  m.value_residual = 'none'  # 'none', 'resformer', 'svformer' or 'satformer'
  m.parallel_block = 'none'  # 'none', 'gptj' (one shared norm) or 'neox' (two norms)
  m.moda = False  # MoDA: each head also attends to the same token's K/V of every earlier layer
  m.embed_projection = False  # OSP: learnable D x D maps after the embedding and before the head
  m.loops = 1  # recurrence K: num_layers / loops shared blocks applied loops times (num_layers stays the effective depth)
  m.loop_lora_rank = 0  # relaxed recursion: rank of the per-loop LoRA on every block matrix (0 = plain tying)

  d = c.data = ConfigDict()
  d.source = 'mix'  # 'grammar', 'khop', 'mix', 'python_docs', 'text:GLOB', 'array_record:GLOB'
  d.seq_len = 128  # T, tokens per sequence
  d.batch_size = 16  # global batch (sequences per step)
  d.eval_batches = 4  # batches in the fixed held-out eval set
  d.tokenizer = 'byte'  # 'byte', a SentencePiece .model or a tokenizer.json path (text, python_docs)
  d.eval_fraction = 0.05  # held-out fraction of a text corpus (python_docs: of its documents)
  d.document_mask = False  # attention only within a document (segment ids from the source's EOS)
  d.khop_max = 4  # largest number of hops in the k-hop task
  d.grammar_seed = 0  # seed of the synthetic grammar itself (not of the sampling)
  d.khop_queries = 4  # k-hop: queries per sequence
  d.khop_distractors = 4  # k-hop: distractor assignments per query
  d.read_threads = 2  # grain read threads
  d.prefetch = 4  # grain prefetch buffer (batches)
  d.workers = 0  # grain worker processes reading records (0 = read in this process)

  o = c.optim = ConfigDict()
  o.name = 'adamw'  # 'adamw'; 'muon': Muon on matrices but embeddings / head, AdamW on the rest
  o.lr = 3e-3  # peak learning rate
  o.schedule = 'cosine'  # 'constant', 'cosine', 'linear', 'wsd'
  o.warmup_steps = 20  # linear warmup from 0
  o.min_lr_ratio = 0.1  # final lr / peak lr for cosine, linear and wsd
  o.decay_fraction = 0.2  # wsd: fraction of steps spent decaying
  o.weight_decay = 0.1  # AdamW decoupled weight decay
  o.decay_norms = False  # apply weight decay to norm gains, biases and other scalars / vectors
  o.decay_embeddings = False  # apply weight decay to embeddings
  o.decay_residual = False  # apply weight decay to residual-design weights (HC, DWA, ...; toward their init)
  o.clip_norm = 1.0  # global gradient-norm clip (0 = off)
  o.b1 = 0.9
  o.b2 = 0.95
  o.eps = 1e-8
  o.muon_beta = 0.95  # Muon: Nesterov momentum decay
  o.muon_ns_steps = 5  # Muon: Newton-Schulz iterations
  o.muon_rms = 0.2  # Muon: update RMS per matrix (0.2 ~ AdamW's, so both share optim.lr)
  o.qk_slow_factor = 1.0  # LR factor c on W_Q, W_K of the upper layers early on (1 = off)
  o.qk_slow_from_layer = 0  # first (1-based) slowed layer (0 = num_layers // 2 + 1)
  o.qk_slow_steps = 0  # steps at factor c before the ramp
  o.qk_slow_ramp = 0  # steps of the linear ramp from c back to 1
  o.llr = False  # LLR: per-module LR multipliers from heavy-tail ESD exponents
  o.llr_min = 1.0  # LLR: multiplier of the heaviest-tailed module
  o.llr_max = 3.0  # LLR: multiplier of the lightest-tailed module (and embedding, head)
  o.llr_every = 40  # LLR: steps between recomputations
  o.llr_transition_steps = 20  # LLR: steps of the linear move to new targets
  o.llr_fraction = 0.2  # LLR: recompute only while step <= fraction * train.steps

  t = c.train = ConfigDict()
  t.steps = 200  # optimizer steps
  t.seed = 0  # init and data seed
  t.log_every = 10  # steps between progress lines and per-layer metrics
  t.eval_every = 100  # steps between evaluations (and at the end)
  t.checkpoint_every = 100  # steps between checkpoints (and at the end)
  t.keep_checkpoints = 2  # checkpoints kept on disk
  t.watchdog_seconds = 1800.0  # a stuck step, analysis, eval or checkpoint exits non-zero after this; 0 = off
  t.cpu_options = 'auto'  # train step's XLA-CPU dots where oneDNN is allowed (x86, one CPU device, no compilation cache: --nocompilation_cache or a bucket workdir): 'onednn', 'eigen', or 'auto' (timed once per host and shape, cached; depthscale.training.cpu_calibration)
  t.prores = 'none'  # ProRes schedule: see depthscale.training.dynamics.PRORES
  t.prores_warmup_steps = 0  # ProRes W: total warmup steps (layer l done at ~W l / L)
  t.prores_value = 'zero'  # ProRes stagewise floor / fix constant: zero, inv_L, inv_sqrt_L, inv_sqrt_l
  t.branchnorm_steps = 0  # BranchNorm (spec's RECONSTRUCTION) T, the maximum norm step; >= 1 with it
  t.layerdrop = 0.0  # LayerDrop p: skip each block with probability p per batch
  t.layerskip_p_max = 0.0  # LayerSkip per-sample layer-dropout rate of the last block (0 = off)
  t.layerskip_curriculum = 'exp'  # LayerSkip time curriculum: 'exp' (from scratch) or 'none'
  t.early_exit_scale = 0.0  # LayerSkip early-exit loss e_scale (0 = off)

  a = c.metrics = ConfigDict()
  a.analysis_every = 100  # steps between per-layer analyses (depthscale.training.analysis), 0 = off; also at the last step
  a.analysis_batch_size = 4  # sequences of the first eval batch the analyses run on
  a.analysis_layers = 32  # skip_delta_loss (one forward pass each) on at most this many evenly spaced layers; 0 = every layer
  a.analysis_compile = 'auto'  # analysis program's LLVM level on CPU: 'optimized' (XLA's default), 'light' (1: compiles faster, runs as fast), 'fast' (0: faster still, runs slower), 'auto' (fast when a run's analyses are cheap, else light)
  a.tb_layers = 64  # per-layer TensorBoard scalars for at most this many layers (evenly spaced subset)
  a.images = True  # at the end, TensorBoard images of the main metrics: layer x step heatmaps, l/L profiles

  p = c.posthoc = ConfigDict()  # procedures on a trained model (depthscale.posthoc)
  p.init_from = ''  # start from a finished rung's final parameters: its directory, or the name of a rung of the same ladder ('' = from scratch)
  p.prune_layers = 0  # Gromov et al. 2024: drop the n consecutive blocks of init_from's model whose input and output streams are closest in angle, then fine-tune (heal)
  p.remove_norms_every = 0  # Heimersheim 2024: steps between removing the norms one at a time (each then divides by its frozen mean input std; 0 = off)
  p.remove_norms_start = 0  # step at which the first norm is removed

  s = c.mesh = ConfigDict()
  s.data = -1  # data-parallel axis size (-1 = the remaining devices)
  s.fsdp = 1  # parameter-sharding axis size
  s.tensor = 1  # tensor-parallel axis size
  s.dcn_data = 1  # slices (multi-slice/DCN): the data axis spans this many slices
  s.max_replicated_size = 1 << 20  # largest parameter (elements) left whole when fsdp*tensor > 1
  r = s.rules = ConfigDict()  # logical axis -> comma-separated mesh axes ('' = replicated)
  r.batch = 'data,fsdp'  # batch rows of data and activations
  r.embed = 'fsdp'  # d_model axis of parameters (FSDP)
  r.mlp = 'tensor'  # MLP hidden axis (tensor parallelism)
  r.heads = 'tensor'  # attention heads (tensor parallelism)
  r.kv = ''  # head_dim
  r.vocab = 'tensor'  # vocabulary axis of embedding, head and logits
  r.layers = ''  # the scanned layer axis: never sharded

  la = c.launch = ConfigDict()  # a rung's resources on a Ray cluster (python -m depthscale.launch)
  la.cpus = 1  # CPU cores per process; XLA's CPU thread pool follows it (PJRT_NPROC)
  la.hosts = 1  # JAX processes per rung, one per node, gang-scheduled (jax.distributed)
  la.tpu = ''  # a whole TPU slice per rung ('v5p-64', 'v6e-16', ...): one process per host; '' = none
  la.gpus = 0  # GPUs per process (per host)
  la.retries = 3  # reruns after a node loss or a killed process (resuming from its checkpoint)
  return c


def flatten(d: dict, prefix: str = '') -> dict:
  """{'a': {'b': 1}} -> {'a.b': 1}."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f'{prefix}{k}.'))
    else:
      out[prefix + k] = v
  return out


def key_without(cfg: ConfigDict, fields) -> str:
  """cfg as sorted JSON with each (section, field) of `fields` set to its type's zero: equal
  for configs that differ only there."""
  c = cfg.copy_and_resolve_references()
  for section, field in fields:
    c[section][field] = type(c[section][field])(0)
  return c.to_json_best_effort(sort_keys=True)


def _fail(field: str, value, allowed: str) -> None:
  raise ConfigError(f'{field}={value!r} is invalid: allowed {allowed}')


def check_positive(cfg: ConfigDict, fields: list[str]) -> None:
  """Raises ConfigError for the first of the dotted fields that is not > 0."""
  for f in fields:
    section, name = f.split('.')
    if not cfg[section][name] > 0:
      _fail(f, cfg[section][name], 'a positive number')


def check_choice(field: str, value, choices) -> None:
  """Raises ConfigError unless value is one of choices."""
  if value not in choices:
    _fail(field, value, 'one of ' + ', '.join(sorted(map(str, choices))))


def check_norm_methods(m: ConfigDict) -> None:
  """Checks the normalization switches of the model section and their combinations."""
  check_choice('model.keel_alpha', m.keel_alpha, ('sublayers', 'blocks'))
  check_choice('model.normformer_head_scale', m.normformer_head_scale, ('paper', 'code'))
  check_choice('model.qk_norm', m.qk_norm, inner_norms.QK_NORMS)
  if not 0 <= m.mix_ln_alpha <= 1:
    _fail('model.mix_ln_alpha', m.mix_ln_alpha, 'a number in [0, 1]')
  if m.qk_norm_seq_len < 0 or m.qk_norm_seq_len == 1:
    _fail('model.qk_norm_seq_len', m.qk_norm_seq_len, '0 (= data.seq_len) or an integer >= 2')
  if m.bhyt_kappa <= 0:
    _fail('model.bhyt_kappa', m.bhyt_kappa, 'a positive number')
  placements.check_modifiers(m)
  if m.qk_norm != 'none' and placements.PLACEMENTS[m.block].normalizes_qk:
    _fail('model.qk_norm', m.qk_norm, f"'none' with model.block={m.block} (it normalizes q, k itself)")
  norms.check_options(m)


def _validate_params_dynamics(cfg: ConfigDict) -> None:
  """Parametrization, init and training-dynamics fields."""
  m, t, o = cfg.model, cfg.train, cfg.optim
  check_choice('model.parametrization', m.parametrization, parametrization.PARAMETRIZATIONS)
  check_choice('model.init', m.init, parametrization.INITS)
  for f in ('base_d_model', 'base_num_layers'):
    if m[f] < 0:
      _fail(f'model.{f}', m[f], '0 (the model itself) or a positive size')
  row = placements.PLACEMENTS[m.block]
  if row.init and m.init not in ('normal', row.init):
    _fail('model.init', m.init, ' or '.join(repr(i) for i in ('normal', row.init) if i in
                                            parametrization.INITS)
          + f" with model.block={m.block} (the placement's own init, {row.init}, applies)")
  if parametrization.INITS[m.init].scales_skip:
    others = ', '.join(i for i, row in parametrization.INITS.items() if not row.scales_skip)
    if not residual.DESIGNS[m.residual].plain:
      _fail('model.init', m.init, f'one of {others} with model.residual={m.residual} (its skip '
            f'multiplier needs model.residual in {", ".join(rows_with(residual.DESIGNS, "plain"))})')
    if m.parallel_block != 'none':
      _fail('model.init', m.init, f'one of {others} with model.parallel_block={m.parallel_block}')
  check_choice('train.prores', t.prores, dynamics.PRORES)
  check_choice('train.prores_value', t.prores_value, dynamics.PRORES_VALUES)
  if t.prores != 'none' and t.prores_warmup_steps < m.num_layers:
    _fail('train.prores_warmup_steps', t.prores_warmup_steps,
          f'at least model.num_layers={m.num_layers} when train.prores is set')
  if t.prores == 'fix' and t.prores_value == 'zero':
    _fail('train.prores_value', t.prores_value, "inv_L, inv_sqrt_L or inv_sqrt_l with train.prores='fix'")
  if row.check:
    row.check(cfg)
  check_choice('train.layerskip_curriculum', t.layerskip_curriculum, dynamics.LAYERSKIP_CURRICULA)
  for f in ('layerdrop', 'layerskip_p_max'):
    if not 0 <= t[f] < 1:
      _fail(f'train.{f}', t[f], 'a number in [0, 1)')
  if t.early_exit_scale < 0:
    _fail('train.early_exit_scale', t.early_exit_scale, 'a non-negative number')
  if not 0 < o.qk_slow_factor:
    _fail('optim.qk_slow_factor', o.qk_slow_factor, 'a positive number (1 = off)')
  for f in ('qk_slow_from_layer', 'qk_slow_steps', 'qk_slow_ramp'):
    if o[f] < 0:
      _fail(f'optim.{f}', o[f], 'a non-negative integer')
  if not 0 < o.llr_min <= o.llr_max:
    _fail('optim.llr_min', o.llr_min, f'a positive number <= optim.llr_max={o.llr_max}')
  check_positive(cfg, ['optim.llr_every'])
  if not 0 <= o.llr_fraction <= 1:
    _fail('optim.llr_fraction', o.llr_fraction, 'a number in [0, 1]')
  _validate_muon(cfg)


def _validate_muon(cfg: ConfigDict) -> None:
  """Optimizer choice, Muon's fields and the embedding projection."""
  m, o = cfg.model, cfg.optim
  check_choice('optim.name', o.name, optim.OPTIMIZERS)
  check_choice('model.embed_projection', m.embed_projection, (False, True))
  if not 0 <= o.muon_beta < 1:
    _fail('optim.muon_beta', o.muon_beta, 'a number in [0, 1)')
  if not isinstance(o.muon_ns_steps, int) or o.muon_ns_steps < 1:
    _fail('optim.muon_ns_steps', o.muon_ns_steps, 'a positive integer')
  check_positive(cfg, ['optim.muon_rms'])
  if o.name == 'muon' and m.parametrization != 'standard':
    _fail('optim.name', o.name, f"'adamw' with model.parametrization={m.parametrization} "
          "(its LR and epsilon rules are derived for Adam)")
  if m.embed_projection and placements.PLACEMENTS[m.block].unit_sphere:
    _fail('model.embed_projection', m.embed_projection,
          f'False with model.block={m.block} (its weights live on the unit sphere)')
  if o.name == 'muon' and m.mlp_taper != 'none':
    _fail('optim.name', o.name, f"'adamw' with model.mlp_taper={m.mlp_taper} (Muon's update "
          'scale would follow the padded MLP width, not each block\'s)')


def _validate_posthoc(cfg: ConfigDict) -> None:
  """The posthoc section's own fields (init_from's rung is checked when the run starts)."""
  p = cfg.posthoc
  if not isinstance(p.prune_layers, int) or p.prune_layers < 0:
    _fail('posthoc.prune_layers', p.prune_layers, 'a non-negative integer')
  if p.prune_layers and not p.init_from:
    _fail('posthoc.prune_layers', p.prune_layers, "0 unless posthoc.init_from names the rung to prune")
  for f in ('remove_norms_every', 'remove_norms_start'):
    if not isinstance(p[f], int) or p[f] < 0:
      _fail(f'posthoc.{f}', p[f], 'a non-negative integer')
  if p.remove_norms_every:
    m, row = cfg.model, placements.PLACEMENTS[cfg.model.block]
    if not norms.NORMS[m.norm].removable:
      _fail('model.norm', m.norm, ' or '.join(rows_with(norms.NORMS, 'removable'))
            + ' with posthoc.remove_norms_every')
    plain = (not row.inner and not row.normalizes_qk and not row.unit_sphere
             and row.first_blocks is None and m.qk_norm == 'none' and not m.layer_rope
             and residual.DESIGNS[m.residual].plain)
    if not plain:
      _fail('posthoc.remove_norms_every', p.remove_norms_every, '0 unless every norm is a block '
            'or final norm (no inner, q/k or LayerRoPE norms, no Mix-LN, model.residual in '
            f'{", ".join(rows_with(residual.DESIGNS, "plain"))})')
    if cfg.optim.decay_norms:
      _fail('optim.decay_norms', True, 'False with posthoc.remove_norms_every (the frozen '
            'divisors must not decay)')


def _validate_rope_bias(m: ConfigDict) -> None:
  """RoPE scaling and the matrix biases."""
  check_choice('model.rope_scaling', m.rope_scaling, ('none', 'linear', 'llama3'))
  check_choice('model.attn_bias', m.attn_bias, ('none', 'qkv', 'all'))
  check_choice('model.mlp_bias', m.mlp_bias, (False, True))
  if m.rope_scaling != 'none' and not m.rope_scaling_factor > 0:
    _fail('model.rope_scaling_factor', m.rope_scaling_factor, 'a positive number')
  if m.rope_scaling == 'llama3' and not (0 < m.rope_low_freq_factor < m.rope_high_freq_factor
                                         and m.rope_original_max_len > 0):
    _fail('model.rope_low_freq_factor', m.rope_low_freq_factor, 'a positive number below '
          f'model.rope_high_freq_factor={m.rope_high_freq_factor} (and a positive '
          'model.rope_original_max_len)')


def validate_residual(m: ConfigDict) -> None:
  """Checks the residual-design fields of the model config."""
  check_choice('model.residual', m.residual, residual.DESIGNS)
  check_choice('model.value_residual', m.value_residual, residual.VALUE_RESIDUALS)
  check_choice('model.parallel_block', m.parallel_block, residual.PARALLEL_BLOCKS)
  check_choice('model.laurel', m.laurel, residual.LAURELS)
  check_choice('model.moda', m.moda, (False, True))
  for f in ('hc_rate', 'mhc_sinkhorn_iters', 'dwa_dilation', 'laurel_rank', 'laurel_window'):
    if m[f] < 1:
      _fail(f'model.{f}', m[f], 'a positive integer')
  if m.dwa_period < 1 or m.num_layers % m.dwa_period:
    _fail('model.dwa_period', m.dwa_period, f'a divisor of model.num_layers={m.num_layers}')
  subs = m.num_layers * residual.sublayers_per_block(m)
  if m.residual == 'block_attn_res' and not 1 <= m.attn_res_blocks <= subs:
    _fail('model.attn_res_blocks', m.attn_res_blocks, f'1..{subs} (residual sublayers)')


def validate(cfg: ConfigDict) -> None:
  """Checks a resolved config; raises ConfigError with a one-line message."""

  check_positive(cfg, ['model.num_layers', 'model.d_model', 'model.num_heads',
                       'model.vocab_size', 'model.init_std', 'model.norm_eps',
                       'data.seq_len', 'data.batch_size', 'data.eval_batches',
                       'optim.lr', 'train.steps', 'train.log_every',
                       'train.eval_every', 'train.checkpoint_every',
                       'train.keep_checkpoints'])
  m = cfg.model
  if m.d_model % m.num_heads:
    _fail('model.num_heads', m.num_heads, f'a divisor of model.d_model={m.d_model}')
  kv = m.num_kv_heads or m.num_heads
  if kv < 0 or m.num_heads % kv:
    _fail('model.num_kv_heads', m.num_kv_heads, f'0 or a divisor of model.num_heads={m.num_heads}')
  if m.d_ff < 0 or (m.d_ff == 0 and m.mlp_ratio <= 0):
    _fail('model.d_ff', m.d_ff, '0 (use mlp_ratio > 0) or a positive width')
  check_choice('model.block', m.block, placements.PLACEMENTS)
  check_choice('model.norm', m.norm, norms.NORMS)
  check_choice('model.position', m.position, ('rope', 'learned'))
  _validate_rope_bias(m)
  check_norm_methods(m)
  check_choice('model.mlp', m.mlp, ops.MLPS)
  taper.check(m)
  check_choice('model.dtype', m.dtype, ('float32', 'bfloat16', 'float16'))
  if m.remat != 'none' and not hasattr(jax.checkpoint_policies, m.remat):
    _fail('model.remat', m.remat, "'none' or a jax.checkpoint_policies name "
          "(e.g. nothing_saveable, dots_saveable)")
  if not isinstance(m.unroll_max_layers, int) or m.unroll_max_layers < -1:
    _fail('model.unroll_max_layers', m.unroll_max_layers,
          'an integer >= -1 (0 = always a rolled scan, -1 = 16 on CPU and 0 on TPU / GPU)')
  check_choice('model.attention_kernel', m.attention_kernel, ('auto',) + ops.ATTENTION_KERNELS)
  if m.position == 'rope' and (m.d_model // m.num_heads) % 2:
    _fail('model.num_heads', m.num_heads, 'a value giving an even head_dim with rope')
  validate_residual(m)
  recurrence.validate(cfg)
  check_choice('optim.schedule', cfg.optim.schedule, ('constant', 'cosine', 'linear', 'wsd'))
  if not 0 <= cfg.optim.warmup_steps <= cfg.train.steps:
    _fail('optim.warmup_steps', cfg.optim.warmup_steps, f'0..train.steps={cfg.train.steps}')
  for f in ('weight_decay', 'clip_norm', 'min_lr_ratio'):
    if cfg.optim[f] < 0:
      _fail(f'optim.{f}', cfg.optim[f], 'a non-negative number')
  for f in ('b1', 'b2', 'decay_fraction'):
    if not 0 <= cfg.optim[f] <= 1:
      _fail(f'optim.{f}', cfg.optim[f], 'a number in [0, 1]')
  if not isinstance(cfg.train.seed, int) or not 0 <= cfg.train.seed < 2**31:
    _fail('train.seed', cfg.train.seed, 'an integer in [0, 2**31) (an int32 argument of the programs)')
  if not isinstance(cfg.train.watchdog_seconds, (int, float)) or cfg.train.watchdog_seconds < 0:
    _fail('train.watchdog_seconds', cfg.train.watchdog_seconds, '0 (off) or a positive number of seconds')
  check_choice('train.cpu_options', cfg.train.cpu_options, cpu_calibration.CHOICES)
  check_positive(cfg, ['metrics.analysis_batch_size', 'metrics.tb_layers'])
  check_choice('metrics.analysis_compile', cfg.metrics.analysis_compile, ('auto', 'optimized', 'light', 'fast'))
  n = cfg.metrics.analysis_layers
  if not isinstance(n, int) or n < 0 or n == 1:
    _fail('metrics.analysis_layers', n, '0 (every layer) or an integer >= 2')
  if cfg.metrics.analysis_every < 0:
    _fail('metrics.analysis_every', cfg.metrics.analysis_every, '0 (off) or a positive number of steps')
  if cfg.metrics.analysis_batch_size > cfg.data.batch_size:
    _fail('metrics.analysis_batch_size', cfg.metrics.analysis_batch_size,
          f'1..data.batch_size={cfg.data.batch_size}')
  _validate_params_dynamics(cfg)
  _validate_posthoc(cfg)
  for f in ('data', 'fsdp', 'tensor'):
    if cfg.mesh[f] == 0 or cfg.mesh[f] < -1:
      _fail(f'mesh.{f}', cfg.mesh[f], '-1 or a positive axis size')
  sharding.validate(cfg.mesh)
  data.validate(cfg.data, m.vocab_size)
  validate_launch(cfg.launch)


def validate_launch(la: ConfigDict) -> None:
  """The launch section: counts are integers, a TPU slice is a known name and is not mixed
  with GPUs or a host count (the slice gives one process per host)."""
  for f, low in (('cpus', 1), ('hosts', 1), ('gpus', 0), ('retries', 0)):
    if not isinstance(la[f], int) or isinstance(la[f], bool) or la[f] < low:
      _fail(f'launch.{f}', la[f], f'an integer >= {low}')
  if la.tpu:
    try:
      if topology.parse(la.tpu).platform != 'tpu':
        raise ConfigError(la.tpu)
    except ConfigError:
      _fail('launch.tpu', la.tpu, "'' or a TPU slice name such as v5p-64, v5e-16, v6e-8, v4-32")
    if la.gpus or la.hosts != 1:
      _fail('launch.tpu', la.tpu, "'' with launch.gpus or launch.hosts set (a slice runs one "
            'process per host of its own)')
