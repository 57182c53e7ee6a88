"""Every method of docs/methods.md that trains from scratch, each at its own best learning
rate, on natural text: the measurement behind most rows of docs/claims.md.

Run (arg = smoke | cpu | tokens20; default cpu):
  python -m depthscale.main --config=experiments/method_survey.py:cpu --workdir=runs/method_survey
  python -m depthscale.launch --config=experiments/method_survey.py:tokens20 \
      --workdir=runs/survey20 --config.launch.cpus=1   # both cores: two rungs at a time
  python -m depthscale.compare runs/method_survey   # best rate, seeds, mean and 95% t interval
  python -m depthscale.claims --runs method_survey:cpu=runs/method_survey ...

Ladder: one variant per method (VARIANTS: placements, norm functions, MLPs, inits, residual
designs, recurrence, training dynamics, optimizers; one per row of docs/methods.md, so one of
static / dynamic hyper-connections, of ResFormer / SVFormer / SATFormer, of the parallel
blocks, of AttnRes / Block AttnRes and of the reference inits), each a change of the baseline
`pre_ln` (Pre-LN, LayerNorm, GELU, standard residual, AdamW, normal init). ladder.lr_sweep:
stage 1 trains every variant at 4 log-spaced rates (1e-3, 3e-3, 1e-2, 3e-2; seed 0) and, where
the best of them is at the grid's edge, up to 2 rates past it (extend=2: 9e-2 then 0.27 above,
3.3e-4 then 1.1e-4 below, each only while the best is still the outermost), stage 2 trains
seeds 1..3 at the variant's best stage-1 rate. Data: python_docs (English prose,
bytes), eval on 8 held-out batches. Size cpu: L 8, d 32, 2 heads, T 64, batch 8, 300 steps
(153,600 tokens, ~1.5 per non-embedding parameter of the baseline), 10% warmup then cosine
decay; `pre_ln` and `lns` also run the end-of-run analyses (effective depth, skip-one-block).
smoke: 3 variants, 2 rates, 1 seed, L 2, 20 steps.

Runtime: cpu: 468 rungs (52 variants x 9), of which 386 train: 27-130 s each on the 2-core
machine with two rungs training at once and other jobs running: the grid and the seeds (364
rungs) of 38 variants in 2 h 17 min at load average 4.1-8.9 (mean 6.9), of the other 14 in
61 min at load 2.6-10.2 (mean 8.7); then the extensions, added to that run directory: 22
extension rungs and 6 stage-2 rungs again (where an extension became the best) in 35 min, one
rung at a time beside other jobs (load average 4-9). The stage-2 rungs an extension did not
change were kept, their choice re-made over the extended sweep (the same rate).
Expected result (measured, cpu, all 52 variants, final eval loss, mean and 95% Student-t
interval over 3 seeds at each best rate; the rows of docs/claims.md): baseline Pre-LN 2.94
[2.56, 3.32] at 3e-2. Wholly below its interval: Muon 2.10 [2.06, 2.13], OSP 2.15 [2.04,
2.26], DeepScaleLM's init 2.20 [2.16, 2.24], FixNorm 2.24 [2.15, 2.32], nGPT 2.28 [2.18,
2.38], SimpleNorm 2.30 [2.24, 2.36] (all at 3e-2) and small init 2.31 [2.07, 2.56] at 1e-2.
ScaleNorm without FixNorm's unit-norm embeddings ends at 2.74 [2.63, 2.84]. Without norms,
ReLU 2.40 [2.23, 2.57] beats GELU 2.78 [2.73, 2.83]. Post-LN's best rate is 1e-3 (3.3e-4
is worse), with warmup 3.11 [3.03, 3.19] and without 3.09 [3.02, 3.16] (warmup changes
nothing at its best rate). DeepNorm 2.82 [2.46, 3.17], Mix-LN 2.91 [2.65, 3.17] and LNS 2.72
[2.57, 2.87] overlap Pre-LN. DyT and Derf end at 3.25-3.31 at every rate from 1e-3 to 9e-2
(3.24 and 3.23 over the seeds). Looping 2 shared blocks 4 times ends at 3.14 [2.81, 3.48],
relaxed with rank-4 LoRA at 3.04 [2.97, 3.12] (at 1e-3). Peri-LN and Sandwich-LN are one
placement here (docs/methods.md) and end identically, 3.09 [2.86, 3.33]. LNS does not deepen
the model here: effective_depth/skip is 1 on all 3 seeds, against Pre-LN's 1.7 [0.2, 3.1].
Every best rate lies inside its variant's sweep (the sweep table's `edge` column is empty): of
the 20 variants whose best grid rate was an edge (16 at 3e-2, 4 at 1e-3), 18 keep it, worse
one step past it (9e-2 or 3.3e-4); NormFormer and BHyT move to 9e-2 (0.27 is worse), where
their seeds end at 3.14 [2.77, 3.52] and 3.08 [2.49, 3.67] (3.16 and 3.02 at 3e-2 before).

Size tokens20 (the rows of docs/claims.md, kept in records/method_survey.tokens20.json.gz):
the notebooks' headline variants (HEADLINE: Pre-LN, Post-LN, Mix-LN, LNS, DeepNorm, Keel,
DyT, AttnRes, and Pre-LN wide and shallow at the same non-embedding matrices, L2 d32 against
L8 d16) at L8 d16, 2 heads, T 64, batch 16, 502 steps: 514,048 tokens, at least 20 per
non-embedding parameter of every variant (20.03 for the largest, AttnRes, 20.46 for the
baseline, 20.65 for wide-shallow), python_docs. Stage 1 at 1e-3, 3e-3, 1e-2, 3e-2 (seed 0)
and up to 2 extensions past an edge (9e-2 and 0.27 trained for Pre-LN and DyT, 9e-2 for Keel
and AttnRes), then 5 seeds at each of the two best rates (finalists=2), the variant's rate
the one with the lower mean: every chosen rate lies inside its sweep. 144 rungs (132
trained, 12 extensions not needed) through the launcher (launch.cpus=1, two at a time) in
81.5 min of wall time on the 2-core host, beside the depth-transfer ladder and test jobs
(load average 5.3-10.8, mean 9.4). Measured (final eval loss, mean [95% t] over 5 seeds;
the claims' verdicts from the paired per-seed differences): wide-shallow 2.07 [2.00, 2.14]
at 1e-2, Pre-LN 2.30 [2.11, 2.48] at 3e-2, Keel 2.33 [2.14, 2.51] at 3e-2, LNS 2.39 [2.36,
2.42] at 1e-2, DeepNorm 2.40 [2.23, 2.58] at 1e-2, AttnRes 2.43 [2.31, 2.54] at 3e-2, Mix-LN
2.46 [2.35, 2.57] at 1e-2, Post-LN 2.69 [2.66, 2.71] at 3e-3, DyT 3.25 [3.21, 3.28] at 3e-2.
Paired against Pre-LN: Post-LN +0.39 [+0.20, +0.59] and DyT +0.95 [+0.74, +1.16]
(separated); wide-shallow -0.23 [-0.46, +0.01], Mix-LN +0.17, LNS +0.09, Keel +0.03, AttnRes
+0.13, DeepNorm +0.11 (not separated). Mix-LN below Post-LN -0.22 [-0.32, -0.12], DeepNorm
below Post-LN -0.28 [-0.47, -0.10]. LNS's effective depth (skip) 1.4 [0.7, 2.1] against
Pre-LN's 4.8 [3.8, 5.8]. Seed 0 alone would have chosen other rates for two variants:
Pre-LN 9e-2 (2.118 against 2.129 at 3e-2; over 5 seeds 2.46 against 2.30) and Mix-LN 3e-3
(2.69 over 5 seeds against 2.46 at 1e-2). DyT ends at 3.22-3.29 at every rate from 1e-3 to
0.27, at the data's unigram entropy (3.30 nats): at d16 with alpha0 = 1 its blocks learn
next to nothing, so its row says more about this width and init than about DyT.

Not here: the parametrizations (muP, depth-muP, CompleteP), whose claim is a transfer of
the best rate across width or depth (experiments/depth_mup_transfer.py), and the procedures
on trained models (experiments/posthoc.py).
"""

from depthscale.experiment import study_config
from depthscale.ladder import lr_sweep

# name -> (L, D, heads, seq_len, batch, steps, rates, seeds, extensions past the grid's edge,
# finalist rates that stage 2 trains the seeds at)
SIZES = {
    'smoke': (2, 16, 1, 16, 4, 20, [1e-3, 1e-2], 1, 0, 1),
    'cpu': (8, 32, 2, 64, 8, 300, [1e-3, 3e-3, 1e-2, 3e-2], 3, 2, 1),
    # >= 20 tokens per non-embedding parameter of every variant (the largest, attn_res:
    # 25,664 x 20 <= 502 x 16 x 64)
    'tokens20': (8, 16, 2, 64, 16, 502, [1e-3, 3e-3, 1e-2, 3e-2], 5, 2, 2),
}
ANALYSED = {'metrics.analysis_every': -1}  # -1: the size's step count (get_ladder)

VARIANTS = {
    'pre_ln': ANALYSED,
    # norm placements (depthscale.model.placements)
    'post_ln': {'model.block': 'post_ln'},
    'post_ln_no_warmup': {'model.block': 'post_ln', 'optim.warmup_steps': 0},
    'peri_ln': {'model.block': 'peri_ln'},
    'sandwich_ln': {'model.block': 'sandwich_ln'},
    'mix_ln': {'model.block': 'mix_ln'},
    'deepnorm': {'model.block': 'deepnorm', 'model.init': 'deepnorm'},
    'sub_ln': {'model.block': 'sub_ln'},
    'normformer': {'model.block': 'normformer'},
    'hybridnorm': {'model.block': 'hybridnorm'},
    'hybridnorm_star': {'model.block': 'hybridnorm_star'},
    'keel': {'model.block': 'keel'},
    'branchnorm': {'model.block': 'branchnorm', 'train.branchnorm_steps': 100},
    'ngpt': {'model.block': 'ngpt', 'model.mlp': 'swiglu', 'optim.weight_decay': 0.0,
             'optim.warmup_steps': 0, 'model.tie_embeddings': False},
    'simple_norm': {'model.block': 'simple_norm'},
    # Pre-LN with an added mechanism
    'lns': {'model.ln_scaling': True, **ANALYSED},
    'gpas': {'model.gpas': True},
    'qk_norm': {'model.qk_norm': 'per_head'},
    'layer_rope': {'model.layer_rope': True},
    # norm functions (depthscale.model.norms), Pre-LN
    'rmsnorm': {'model.norm': 'rmsnorm'},
    'crmsnorm': {'model.norm': 'crmsnorm', 'model.norm_bias': True},
    'scalenorm': {'model.norm': 'scalenorm'},
    'fixnorm': {'model.norm': 'scalenorm', 'model.fix_norm': True},
    'dyt': {'model.norm': 'dyt'},
    'derf': {'model.norm': 'derf'},
    'bhyt': {'model.norm': 'bhyt'},
    'seednorm': {'model.norm': 'seednorm'},
    'no_norm': {'model.norm': 'none'},
    # MLPs
    'no_norm_relu': {'model.norm': 'none', 'model.mlp': 'relu'},
    'relu2': {'model.mlp': 'relu2'},
    'swiglu': {'model.mlp': 'swiglu'},
    'taper_cosine': {'model.mlp_taper': 'cosine'},
    'taper_reverse': {'model.mlp_taper': 'reverse'},
    # inits (depthscale.model.parametrization.INITS)
    'small_init': {'model.init': 'small_init'},
    'deepscalelm': {'model.init': 'deepscalelm'},
    # residual-stream designs (depthscale.model.residual)
    'hyper_connections': {'model.residual': 'hyper_connections'},
    'mhc': {'model.residual': 'mhc'},
    'denseformer': {'model.residual': 'denseformer'},
    'attn_res': {'model.residual': 'attn_res'},
    'laurel': {'model.residual': 'laurel', 'model.laurel': 'rw_lr'},
    'resformer': {'model.value_residual': 'resformer'},
    'parallel_gptj': {'model.parallel_block': 'gptj'},
    'moda': {'model.moda': True},
    # depth by recurrence: 2 shared blocks looped 4 times (effective depth 8)
    'loop': {'model.loops': 4},
    'relaxed_loop': {'model.loops': 4, 'model.loop_lora_rank': 4},
    # training dynamics (depthscale.training.dynamics) and optimizers
    'prores': {'train.prores': 'linear', 'train.prores_warmup_steps': -1},  # -1: half the steps
    'layerdrop': {'train.layerdrop': 0.2},
    'layerskip': {'train.layerskip_p_max': 0.2, 'train.early_exit_scale': 0.1},
    'qk_slow': {'optim.qk_slow_factor': 0.1, 'optim.qk_slow_steps': -1, 'optim.qk_slow_ramp': -1},
    'llr': {'optim.llr': True},
    'muon': {'optim.name': 'muon'},
    'osp': {'optim.name': 'muon', 'model.norm': 'ss_rmsnorm', 'model.embed_projection': True},
}
SMOKE = ('pre_ln', 'post_ln', 'lns')
# tokens20: the notebooks' headline claims (docs/claims.md), and Pre-LN wide and shallow at
# the baseline's non-embedding matrices (L2 d32 and L8 d16: 24,576 each)
HEADLINE = ('pre_ln', 'post_ln', 'mix_ln', 'lns', 'deepnorm', 'keel', 'dyt', 'attn_res',
            'wide_shallow')
SHAPES = {'wide_shallow': {'model.num_layers': 2, 'model.d_model': 32}}
_STEP_FIELDS = ('metrics.analysis_every', 'train.prores_warmup_steps', 'optim.qk_slow_steps',
                'optim.qk_slow_ramp')  # -1 in VARIANTS: a fraction of the size's steps


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, steps, *_ = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=max(steps // 10, 1),
                   num_layers=num_layers, d_model=d_model, num_heads=heads)
  c.data.source, c.data.eval_batches = 'python_docs', 8
  c.model.unroll_max_layers, c.metrics.images = 0, False  # compile-bound: rolled scan, no figures
  return c


def _resolve_steps(overrides: dict, steps: int) -> dict:
  """-1 step counts: the analyses at the end, ProRes over half the run, Q/K slowed for a
  tenth and ramped back over the next tenth."""
  share = {'metrics.analysis_every': steps, 'train.prores_warmup_steps': steps // 2,
           'optim.qk_slow_steps': steps // 10, 'optim.qk_slow_ramp': steps // 10}
  return {k: share[k] if k in _STEP_FIELDS and v == -1 else v for k, v in overrides.items()}


def get_ladder(arg: str | None = None):
  *_, steps, rates, seeds, extend, finalists = SIZES[arg or 'cpu']
  names = {'smoke': SMOKE, 'tokens20': HEADLINE}.get(arg, VARIANTS)
  variants = {**VARIANTS, **SHAPES}
  return lr_sweep({n: _resolve_steps(variants[n], steps) for n in names}, rates, seeds, extend,
                  finalists)
