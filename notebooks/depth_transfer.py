# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Hyperparameter transfer across depth: standard vs depth-muP vs CompleteP
#
# **Claim.** With the right depth scaling of the residual branches (and of the learning
# rates), a network's activations and updates keep the same size as depth grows, so the
# learning rate tuned on a shallow model transfers to a deep one. Depth-muP multiplies each
# branch by L^-1/2; CompleteP by L^-1 with the Adam learning rate of the hidden matrices
# unchanged, which also keeps every layer learning features ("complete" feature learning).
#
# **Papers.** Yang et al. 2023 (*Tensor Programs VI*, depth-muP) and Bordelon et al. 2023
# (depthwise hyperparameter transfer); Dey et al. 2025, *Don't be lazy: CompleteP enables
# compute-efficient deep transformers*.
#
# **Reported.** Under the standard parametrization the optimal learning rate shifts with
# depth; under depth-muP / CompleteP it stays put across depths (the papers' LR-vs-loss
# curves per depth), and CompleteP reports compute savings over the other depth
# parametrizations for deep models (see the CompleteP paper's tables).
#
# **Full-size configuration.** CompleteP sweeps Pre-LN GPT models of width 256-2048 and
# depth 2-128 on SlimPajama. `SIZE = 'paper'` selects d 1024 at L 2 ... 128 with GPT-2's
# 50,304-token vocabulary and an LR sweep of 2^-4 ... 2^-11, seq 2048, batch 256, 20k steps;
# experiments/repro_depth_transfer.py gives the `prepare` command that tokenizes SlimPajama
# for it. The default `cpu` size sweeps d 32 at L 2, 4, 8, 16
# and 4 learning rates for 200 steps (base depth L0 = 2) on the synthetic mix, then again on
# natural text (section 5); `DEPTHSCALE_SMOKE=1` runs the coordinate check at L 2 and 16 and
# one LR-sweep rung per parametrization on each.
#
# **What this notebook asserts** (the coordinate check). The defining property: each block's
# update ratio ||x_out - x_in|| / ||x_in|| at init scales as L^-alpha, alpha = 1/2 for
# depth-muP and 1 for CompleteP. Its exponent, measured from L 2 to L 16 (the geometric mean
# over blocks), must lie within 0.15 of alpha; over seeds 0, 1, 2 at the smoke size (CI runs
# seed 0) it was 0.52-0.55 (depth-muP), 0.95-0.98 (CompleteP) and 0.24-0.28 (standard, whose
# stream grows with depth). After 8 steps at lr 1e-2 the activation RMS leaving the last
# block grows with depth under the standard parametrization (more than 3x from L 2 to L 16;
# seeds 0-2: smoke 5.8, 6.4, 11.4x, cpu 4.22, 3.99, 4.22x) and stays within (0.3, 2)x under depth-muP and
# CompleteP (smoke: 0.42-0.60 and 0.98-1.48x). The best learning rate per depth is
# reported, not asserted; the notebook's rows of the claims table (docs/claims.md) get the
# verdicts expected at the size it ran.
#
# **Measured at the `cpu` size (45 min with other jobs running on the 2 cores).** Coordinate
# check, last-block activation RMS at L 16 / at L 2 after 8 steps: standard 4.22, depth-muP
# 0.86, CompleteP 0.91; update-ratio exponent at init over seeds 0-2 (L 2 to 16): standard
# 0.23-0.28, depth-muP 0.52-0.55, CompleteP 0.96-0.98. LR sweep (d 32, 200 steps): the best of {1e-3, 3e-3, 1e-2, 3e-2} is
# 1e-2 at every depth under standard and CompleteP, and moves to 3e-2 at L 8 and 16 under
# depth-muP; best eval loss at L 16: standard 2.53, depth-muP 2.43, CompleteP 2.43. Not
# reproduced at this size: the standard parametrization's optimum does not shift with depth
# on this coarse grid.

# %%
import matplotlib.pyplot as plt
import numpy as np

from depthscale.coord_check import coord_check
from depthscale.experiment import load_module, resolve
from depthscale.results import intervals, notebook

SIZE = 'smoke' if notebook.smoke() else 'cpu'  # 'paper': the full-size ladder (accelerator)
OUT = notebook.outputs('depth_transfer')
EXPERIMENT = f'../experiments/repro_depth_transfer.py:{SIZE}'
_, _, COORD_DEPTHS, DEPTHS, LRS, PARAMS, *_ = load_module(EXPERIMENT.split(':')[0]).SIZES[SIZE]
print('parametrizations:', PARAMS, '| coord-check depths:', COORD_DEPTHS,
      '| sweep depths:', DEPTHS, '| learning rates:', LRS)

# %% [markdown]
# ## 1. Coordinate check across depth
# `depthscale.coord_check` (also `python -m depthscale.coord_check --vary=num_layers`)
# trains each depth for a few steps at a constant lr 1e-2 (no warmup) with per-layer
# statistics on every step.
# Shown: the activation RMS of the stream leaving the last block, per step.

# %%
COORD_STEPS = 8
ALPHA = {'depth_mup': 0.5, 'completep': 1.0}  # branch multiplier (L / L0)^-alpha


def branch_exponent(df) -> float:
  """-d log(update ratio at init, geometric mean over blocks) / d log L, first to last depth."""
  log_ratio = df[df.step == 0].groupby('num_layers').update_ratio.apply(lambda r: np.log(r).mean())
  lo, hi = COORD_DEPTHS[0], COORD_DEPTHS[-1]
  return -(log_ratio[hi] - log_ratio[lo]) / np.log(hi / lo)


coords, alpha_hat = {}, {}
for p in PARAMS:
  (_, cfg), *_ = resolve(EXPERIMENT, {'model.parametrization': p, 'optim.schedule': 'constant',
                                      'optim.warmup_steps': 0})
  df = coord_check(cfg, 'num_layers', COORD_DEPTHS, COORD_STEPS, f'{OUT}/coord_check_{p}')
  last = df[df.layer == df.num_layers]
  coords[p] = last.pivot(index='step', columns='value', values='act_rms')  # step x depth
  alpha_hat[p] = branch_exponent(df)

fig, axes = plt.subplots(1, len(PARAMS), figsize=(4.5 * len(PARAMS), 3.6), sharey=True, squeeze=False)
for ax, p in zip(axes[0], PARAMS):
  for step in (0, COORD_STEPS // 2, COORD_STEPS - 1):
    ax.loglog(COORD_DEPTHS, coords[p].loc[step, COORD_DEPTHS], marker='o', label=f'step {step}')
  ax.set(xlabel='depth L', title=p)
axes[0][0].set_ylabel('act_rms leaving the last block')
axes[0][0].legend()
notebook.save(fig, OUT, 'coord_check')

drift = {p: {s: coords[p].loc[s, COORD_DEPTHS[-1]] / coords[p].loc[s, COORD_DEPTHS[0]]
             for s in (0, COORD_STEPS - 1)} for p in PARAMS}
for p in PARAMS:
  print(f'{p:>10}: act_rms at L{COORD_DEPTHS[-1]} / at L{COORD_DEPTHS[0]}: '
        f'init {drift[p][0]:.2f}, after {COORD_STEPS} steps {drift[p][COORD_STEPS - 1]:.2f}; '
        f'update ratio at init ~ L^-{alpha_hat[p]:.2f}')

# %% [markdown]
# ## 2. Learning-rate sweep across depth (reported, not asserted)

# %%
def sweep_losses(experiment: str, losses) -> dict[tuple[str, int, float], float]:
  """(parametrization, depth, rate) -> eval loss, from a column of a Ranking table (variant
  -> loss, e.g. 'loss@100%')."""
  setting = {intervals.variant(r.name): (cfg.model.parametrization, cfg.model.num_layers,
                                         cfg.optim.lr) for r, cfg in resolve(experiment)}
  return {setting[v]: loss for v, loss in losses.items()}


def print_best(loss: dict[tuple[str, int, float], float]) -> None:
  """Each parametrization's best rate per depth and its loss there."""
  for p in PARAMS:
    best = {f'L{l}': f'{min(LRS, key=lambda lr: loss[p, l, lr]):g}' for l in DEPTHS}
    print(f'{p:>10}: best learning rate per depth {best}; eval loss at the best:',
          {f'L{l}': round(min(loss[p, l, lr] for lr in LRS), 3) for l in DEPTHS})


def show_sweep(loss: dict[tuple[str, int, float], float], name: str, title: str) -> None:
  """Loss against rate per depth, one panel per parametrization (saved as `name`), and
  each parametrization's best rate per depth printed."""
  fig, axes = plt.subplots(1, len(PARAMS), figsize=(4.5 * len(PARAMS), 3.6), sharey=True,
                           squeeze=False)
  for ax, p in zip(axes[0], PARAMS):
    for l in DEPTHS:
      ax.plot(LRS, [loss[p, l, lr] for lr in LRS], marker='o', label=f'L{l}')
    ax.set(xscale='log', xlabel='learning rate', title=f'{p} ({title})')
  axes[0][0].set_ylabel('final eval loss')
  axes[0][0].legend()
  notebook.save(fig, OUT, name)
  print_best(loss)


rows, res, _ = notebook.run(EXPERIMENT, f'{OUT}/runs_{SIZE}')
show_sweep(sweep_losses(EXPERIMENT, res.ranking().table['loss@100%']), 'lr_sweep', 'synthetic mix')

# %% [markdown]
# ## 3. Assertions on the mechanism

# %%
final = COORD_STEPS - 1
assert drift['standard'][final] > 3, f'standard: activations do not grow with depth: {drift}'
for p in PARAMS:
  if p != 'standard':
    assert abs(alpha_hat[p] - ALPHA[p]) < 0.15, f'{p}: update ratio at init ~ L^-{alpha_hat[p]:.2f}'
    assert 0.3 < drift[p][final] < 2, f'{p}: activations depend on depth: {drift}'
print('mechanism assertions passed')


# %% [markdown]
# ## 4. This notebook's rows of the claims table (docs/claims.md)
# The transfer rows (depth-muP, CompleteP) read the sweep above: some rate must be tied
# with the loss-minimizing one at every depth (tied: the paired per-seed difference does not
# separate from 0; with one seed, the best rate alone), and tied sets one grid step apart
# read "does not at this size". The smoke sweep has one depth and one rate, so it measures none
# of them. At `cpu` (d 32, one seed, measured beside other jobs at load average 4-13),
# best rate (final eval loss) at L 2 / 4 / 8 / 16: CompleteP 1e-2 at every depth (2.557,
# 2.484, 2.424, 2.420: reproduces); depth-muP 1e-2, 1e-2, then 3e-2 at L 8 and 16 (2.398,
# 2.430: one grid step, does not at this size); standard also 1e-2 at every depth, so the
# drift the papers contrast against is not seen at this size, while its loss worsens with
# depth beyond L 4 (2.477, 2.504, 2.568) where CompleteP's keeps improving.

# %%
from depthscale.results import claims

TRANSFER_ROWS = ('the optimal learning rate transfers across depth',  # depth-muP
                 '1/sqrt(L) branch scaling makes the optimal rate transfer across depth',
                 'alpha = 1 transfers hyperparameters across depth and trains deep models '
                 'compute-efficiently')  # CompleteP
EXPECTED = {'smoke': {}, 'cpu': dict(zip(TRANSFER_ROWS, (claims.NOT_AT_SIZE, claims.NOT_AT_SIZE,
                                                         claims.REPRODUCES)))}
verdicts = notebook.claims_rows('repro_depth_transfer', SIZE, res, EXPECTED)

# %% [markdown]
# ## 5. On natural text: `python_docs`
# The same sweep (every parametrization, depth and rate, seed 0) on the English prose that
# ships with Python (byte tokens; `repro_depth_transfer.py:{SIZE}-text`), evaluated at every
# quarter of the steps: each parametrization's best rate per depth at 50% and at 100% of
# the steps, and the transfer rows of the claims table measured on it.
#
# **Measured at the `cpu` size** (seed 0; 204,800 tokens, 1-8.2 per non-embedding parameter
# from L 16 to L 2), best rate at L 2 / 4 / 8 / 16 at the end: standard 3e-3, 3e-3, 1e-2,
# 3e-3; depth-muP 3e-3, 3e-2, 3e-2, 3e-2; CompleteP 3e-3, 3e-2, 3e-3, 3e-3 (eval loss 2.858,
# 2.609, 2.802, 2.850). At half the steps standard and CompleteP had the same best rates,
# depth-muP 3e-3, 3e-3, 1e-2, 1e-2. Neighbouring rates often end 0.05-0.3 apart in this one
# seed, and the best rate moves by two grid steps between neighbouring depths, for CompleteP
# too: the transfer rows' rule reads all three as contradicting at `cpu-text`, where the
# synthetic mix's sweep (section 4) has CompleteP's rate hold at every depth. One seed per
# point cannot tell a moved optimum from seed noise; seeds per point (three times this
# sweep) were not run.

# %%
TEXT_EXPERIMENT = f'{EXPERIMENT}-text'
text_rows, text_res, _ = notebook.run(TEXT_EXPERIMENT, f'{OUT}/runs_{SIZE}_text')
print('python_docs sha256:', text_res.summaries.data_sha256.iloc[0])
text_rank = text_res.ranking().table
print('at 50% of the steps:')
print_best(sweep_losses(TEXT_EXPERIMENT, text_rank['loss@50%']))
print('at 100% of the steps:')
show_sweep(sweep_losses(TEXT_EXPERIMENT, text_rank['loss@100%']), 'lr_sweep_text', 'python_docs')

# %%
EXPECTED_TEXT = {'smoke': {}, 'cpu': dict.fromkeys(TRANSFER_ROWS, claims.CONTRADICTS)}
text_verdicts = notebook.claims_rows('repro_depth_transfer', f'{SIZE}-text', text_res,
                                     {f'{s}-text': v for s, v in EXPECTED_TEXT.items()})
