"""Norm placements, each at its own best learning rate (ladder.lr_sweep) on natural text.

Run (arg = smoke | cpu; default cpu):
  python -m depthscale.main --config=experiments/lr_sweep.py:cpu --workdir=runs/lr_sweep
  python -m depthscale.compare runs/lr_sweep   # best rate, seeds, mean and 95% t interval, ranking

Ladder: per placement (Pre-LN, Post-LN, Mix-LN, DeepNorm with its init; smoke: the
first two), stage 1 trains at 4 log-spaced rates (3e-4, 1e-3, 3e-3, 1e-2; seed
0), stage 2 trains seeds 1..3 at the rate whose stage-1 run ended with the lowest eval loss
(chosen when stage 2 starts, recorded in each stage-2 rung's best_lr.json). Data:
python_docs (English prose, bytes), eval on 8 held-out batches. Size cpu: L 4, d 32, T 64,
batch 8, 300 steps (153,600 tokens, ~3 per non-embedding parameter), 10% warmup then
cosine decay. smoke: 2 rates, 2 seeds, 20 steps.

Runtime: cpu: 28 rungs in 17 min on the 2-core machine with other jobs running (load
average ~7). smoke: ~13 s per rung, mostly compilation.
Expected result (measured, cpu, 3 seeds at each best rate, final eval loss, 95% Student-t
interval): Pre-LN 2.79 [2.38, 3.21] at lr 1e-2, DeepNorm 2.81 [2.63, 2.99] at 3e-3, Mix-LN
2.95 [2.83, 3.07] at 3e-3, Post-LN 3.13 [2.86, 3.40] at 3e-3: no placement stalls at its
own rate and every pair of intervals overlaps, so no ranking is stated at this size
(experiments/method_survey.py measures the same claims at L 8 for docs/claims.md). The seed spread (Pre-LN 2.61-2.95) is larger than the placement gaps.
"""

from depthscale.experiment import study_config
from depthscale.ladder import lr_sweep

# name -> (L, D, seq_len, batch, steps, rates, seeds)
SIZES = {
    'smoke': (2, 16, 16, 4, 20, [1e-3, 1e-2], 2),
    'cpu': (4, 32, 64, 8, 300, [3e-4, 1e-3, 3e-3, 1e-2], 3),
}
PLACEMENTS = {'pre_ln': {'model.block': 'pre_ln'}, 'post_ln': {'model.block': 'post_ln'},
              'mix_ln': {'model.block': 'mix_ln'},
              'deepnorm': {'model.block': 'deepnorm', 'model.init': 'deepnorm'}}


def get_config(arg: str | None = None):
  num_layers, d_model, seq_len, batch, steps, _, _ = SIZES[arg or 'cpu']
  c = study_config(arg, seq_len=seq_len, batch=batch, steps=steps, log_every=max(steps // 10, 1),
                   num_layers=num_layers, d_model=d_model, num_heads=1)
  c.data.source, c.data.eval_batches = 'python_docs', 8
  return c


def get_ladder(arg: str | None = None):
  *_, rates, seeds = SIZES[arg or 'cpu']
  placements = dict(list(PLACEMENTS.items())[:2]) if arg == 'smoke' else PLACEMENTS
  return lr_sweep(placements, rates, seeds)
