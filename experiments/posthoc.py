"""Procedures on trained models: layer pruning with healing (Gromov et al. 2024), removing
the norms by fine-tuning (Heimersheim 2024) and linear maps across depth (Csordas et al.
2025), on two Pre-LN models of depth 4 and 8.

Run (the ladder, then the linear maps between its two trained models):
  python -m depthscale.main --config=experiments/posthoc.py:cpu --workdir=runs/posthoc
  python -m depthscale.posthoc.linear_maps --shallow=runs/posthoc/L4 --deep=runs/posthoc/L8

Rungs: L4 and L8 train from scratch; prune_n<k> (k = 0, 2, 4, 6) start from L8's final
parameters (posthoc.init_from), drop the k consecutive blocks whose input and output
streams are closest in angle and fine-tune ("heal") for 60 steps (cpu); prune_n0 is the
same fine-tune without pruning, the control. Each pruned rung's summary.json holds the eval
loss of L8, the loss right after pruning, the dropped blocks and (final_eval_loss) the loss
after healing. ln_free fine-tunes L8 for 100 steps (cpu) while its 17 norms are removed one
every 4 steps from step 8 (Heimersheim 2024): it ends without normalization.

Runtime: the cpu size (d_model 64, T 64, batch 16 on the default mix data; 300 steps per
base model, 60 healing steps, 100 for ln_free) took 5.0 minutes of CPU time for the ladder
plus 8 s for the linear maps; 23 minutes of wall time on a 2-core host with other jobs
running (load average ~17); an idle host should take a few minutes (not measured). The
full size (d_model 256, T 256, 4000 steps) has not been run.

Expected result (the papers' claims): the loss after healing grows slowly with the fraction
dropped until about half of the layers, the dropped blocks are the deeper ones; removing
the norms costs little loss; in the linear maps each layer of the shallow model is best
predicted by the deeper model's layer at the same relative depth.

Measured (cpu size, seed 0; eval loss): L4 2.3662, L8 2.3652 (at this size depth does not
help). Pruning L8 by n blocks (chosen block, angular distance, loss right after pruning ->
after 60 healing steps): n=0 (control) 2.3652 -> 2.3556; n=2 blocks 5-6, d=0.086, 2.3991 ->
2.3622; n=4 blocks 5-8, d=0.158, 2.5758 -> 2.3856; n=6 blocks 3-8, d=0.240, 2.8303 ->
2.4347. ln_free: all 17 norms removed, 2.3652 -> 2.3646. Linear maps L4 -> L8 (held-out
R^2, every entry 0.82-0.99: the streams of these small models are dominated by the token
embedding): the best l'/L' for l/L = 0, .25, .5, .75, 1 is 0, .125, .375, .375, .375, the
diagonal for the first half only.
"""

from depthscale.config import default_config
from depthscale.ladder import Rung

SIZES = {  # arg -> (d_model, heads, seq_len, batch, base steps, healing steps, norm removal every)
    'cpu': (64, 2, 64, 16, 300, 60, 4),
    'full': (256, 4, 256, 32, 4000, 400, 20),
}
DEPTHS = (4, 8)
PRUNED = (0, 2, 4, 6)  # blocks dropped from the 8-block model


def get_config(arg: str | None = None):
  d, heads, seq_len, batch, steps, _, _ = SIZES[arg or 'cpu']
  c = default_config()
  c.model.d_model, c.model.num_heads = d, heads
  c.data.seq_len, c.data.batch_size = seq_len, batch
  c.train.steps = steps
  c.train.log_every = max(steps // 10, 1)
  c.train.eval_every = c.train.checkpoint_every = steps
  c.metrics.analysis_every = steps
  c.optim.warmup_steps = steps // 10
  return c


def _fine_tune(steps: int, **overrides):
  """Overrides of a rung that fine-tunes L8 for `steps` steps at a lower lr."""
  return {'posthoc.init_from': f'L{DEPTHS[-1]}', 'model.num_layers': DEPTHS[-1],
          'train.steps': steps, 'train.log_every': steps // 6, 'train.eval_every': steps,
          'train.checkpoint_every': steps, 'metrics.analysis_every': steps,
          'optim.warmup_steps': steps // 10, 'optim.lr': 1e-3, **overrides}


def get_ladder(arg: str | None = None):
  *_, heal, every = SIZES[arg or 'cpu']
  rungs = [Rung(f'L{l}', {'model.num_layers': l}) for l in DEPTHS]
  for k in PRUNED:
    rungs.append(Rung(f'prune_n{k}', _fine_tune(heal, **{
        'model.num_layers': DEPTHS[-1] - k, 'posthoc.prune_layers': k})))
  norms = 2 * DEPTHS[-1] + 1  # Pre-LN: two per block and the final norm
  rungs.append(Rung('ln_free', _fine_tune((norms + 8) * every, **{
      'posthoc.remove_norms_every': every, 'posthoc.remove_norms_start': 2 * every})))
  return rungs
