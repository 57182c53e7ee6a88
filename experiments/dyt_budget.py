"""DyT against LayerNorm at a small and a large token budget, each norm at its own best
learning rate per budget, on natural text: the measurement behind the row "DyT helps at
small token budgets, hurts at large" of docs/claims.md.

Run (arg = smoke | cpu; default cpu):
  python -m depthscale.main --config=experiments/dyt_budget.py:cpu --workdir=runs/dyt_budget
  python -m depthscale.compare runs/dyt_budget   # best rate, seeds, mean and 95% t interval
  python -m depthscale.claims --runs dyt_budget:cpu=runs/dyt_budget ...

The claim ("DyT is regime-dependent", 2026): on GPT-2 64M, DyT's validation loss is 27.3%
below LayerNorm's at 1M training tokens and 18.8% above it at 118M, about 0.016 and 1.8
tokens per parameter.

Ladder: Pre-LN with LayerNorm (`ln_*`) and with DyT (`dyt_*`, model.norm 'dyt': every norm
replaced, the embedding scaled by a learnable scalar), each at the two budgets (`*_small`,
`*_large`: the step count, with a 10% warmup then cosine decay over it). ladder.lr_sweep:
stage 1 trains every variant at 4 log-spaced rates (1e-3, 3e-3, 1e-2, 3e-2; seed 0) and one
rate past the grid's edge where the best is at it (extend=1), stage 2 trains seeds 1..3 at
the variant's best stage-1 rate. Data: python_docs (English prose, bytes), eval on 8 held-out
batches. Size cpu: L 4, d 64, 2 heads (head_dim 32), T 64, batch 16; small 20 steps (20,480
tokens, 0.1 per non-embedding parameter), large 400 steps (409,600 tokens, 2.1 per
non-embedding parameter; natural_text.tokens_per_param, the same to 2 digits for both
norms). smoke: L 2, d 16, T 16, batch 4, 4 and 16 steps, 2 rates, 1 seed.

Runtime: cpu: 32 rungs (4 variants x (4 rates, 1 extension, 3 seeds)) in 18 min, one rung
at a time in one process beside other jobs (load average 3.7-5.4): ~25 s a small rung, ~45 s
a large one; no extension was needed. smoke: 16 rungs in 8.7 min on one core (load average
3.9-4.8), mostly compilation.
Expected result (measured, cpu; 3 seeds at each variant's best rate, every best rate
inside its grid): at the small budget DyT 3.385 [3.321, 3.449] (lr 1e-2) against LayerNorm
3.291 [3.249, 3.332] (lr 1e-2): DyT is not below, its mean is above and the intervals just
overlap; at the large budget DyT 3.277 [3.198, 3.355] (lr 1e-2) against LayerNorm 2.041
[2.014, 2.069] (lr 3e-3): DyT far above. So "hurts at large" holds and "helps at small"
does not: the row's verdict is "does not at this size" (its rule: claims.Both of two
claims.Below, DyT wholly below LayerNorm at the small budget and wholly above at the large
one). At ~1.5 tokens per non-embedding parameter (L 8, d 32, 3 seeds at each best rate),
experiments/method_survey.py measured DyT's mean 3.24 above Pre-LN's 2.94 [2.56, 3.32],
inside its interval.
"""

from depthscale.experiment import study_config
from depthscale.ladder import lr_sweep

# name -> (L, D, heads, seq_len, batch, (small steps, large steps), rates, seeds)
SIZES = {
    'smoke': (2, 16, 1, 16, 4, (4, 16), [1e-3, 1e-2], 1),
    'cpu': (4, 64, 2, 64, 16, (20, 400), [1e-3, 3e-3, 1e-2, 3e-2], 3),
}
NORMS = {'ln': {'model.norm': 'layernorm'}, 'dyt': {'model.norm': 'dyt'}}
BUDGETS = ('small', 'large')


def budget(steps: int) -> dict:
  """The overrides that train for `steps`: study_config's step-derived fields at that count."""
  return {'train.steps': steps, 'train.log_every': max(steps // 10, 1),
          'train.eval_every': steps, 'train.checkpoint_every': steps,
          'optim.warmup_steps': steps // 10}


def get_config(arg: str | None = None):
  num_layers, d_model, heads, seq_len, batch, (_, steps), _, _ = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=max(steps // 10, 1),
                   num_layers=num_layers, d_model=d_model, num_heads=heads)
  c.data.source, c.data.eval_batches = 'python_docs', 8
  c.model.unroll_max_layers, c.metrics.images = 0, False  # compile-bound: rolled scan, no figures
  return c


def get_ladder(arg: str | None = None):
  *_, steps, rates, seeds = SIZES[arg or 'cpu']
  return lr_sweep({f'{n}_{b}': {**o, **budget(s)} for b, s in zip(BUDGETS, steps)
                   for n, o in NORMS.items()}, rates, seeds, extend=1)
