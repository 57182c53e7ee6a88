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
# # The Curse of Depth: Pre-LN variance growth, LayerNorm Scaling and Mix-LN
#
# **Claim.** In Pre-LN Transformers the residual-stream variance grows with depth, so the
# deep blocks become close to the identity and contribute little ("nearly half of the
# layers are less effective than expected"). LayerNorm Scaling (LNS: multiply each
# pre-norm output of block l by 1/sqrt(l)) keeps the variance in check; Mix-LN (Post-LN
# in the first blocks, Pre-LN after) balances the gradient norms across depth.
#
# **Papers.** Sun et al. 2025, *The Curse of Depth in Large Language Models* (LNS);
# Li et al. 2024, *Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
# Post-LN*. Related: Gromov et al. 2024 (deep layers can be pruned), Csordás et al. 2025
# (second-half layers contribute little).
#
# **Reported.** Pre-LN output variance grows with depth (exponentially in their analysis)
# and the deep blocks' derivative approaches the identity; LNS improves pre-training over
# Pre-LN from 130M to 1B parameters and the gain carries over to fine-tuning (LNS paper).
# Mix-LN outperforms Pre-LN and Post-LN from 70M to 7B parameters with more uniform
# gradient norms across layers (Mix-LN paper). Removing a single deep layer of a Pre-LN
# LLM barely changes its benchmark scores, removing an early one does (both papers' layer
# pruning figures).
#
# **Full-size configuration.** The papers train LLaMA-style models on C4 (130M-1B for LNS,
# 70M-7B for Mix-LN), lr 1e-3, cosine schedule. Here `SIZE = 'paper'` selects the
# LLaMA-350M model (L 24, d 1024, RMSNorm, SwiGLU, RoPE, T5's 32,000-token vocabulary; seq
# 256, batch 256, 20k steps); experiments/repro_curse_of_depth.py gives the `prepare` command
# that tokenizes C4 for it. The default `cpu` size (L 16,
# d 64, 300 steps, 3 seeds) runs on a laptop CPU; `DEPTHSCALE_SMOKE=1` shrinks it for CI.
#
# **What this notebook asserts** (the mechanism, with margins far outside the seed
# spread): Pre-LN `act_var` grows with depth at step 0 and after training, and its
# per-layer update ratio falls with depth; LayerNorm Scaling keeps the last block's
# variance lower, at init and trained, and its growth over depth several times smaller;
# replacing an early Pre-LN block by the identity costs far more loss than replacing a
# late one. Mix-LN's gradient profile and every loss ranking are reported, not asserted;
# the notebook's rows of the claims table (docs/claims.md) get the verdicts expected at
# the size it ran.

# %%
import matplotlib.pyplot as plt
import numpy as np

from depthscale import compare
from depthscale.results import notebook

SIZE = 'smoke' if notebook.smoke() else 'cpu'  # 'paper': the full-size ladder (accelerator)
OUT = notebook.outputs('curse_of_depth')
LADDER = f'{OUT}/runs_{SIZE}'
rows, res, seeds = notebook.run(f'../experiments/repro_curse_of_depth.py:{SIZE}', LADDER)
layers = res.layers
variants = list(seeds)
print('variants:', variants, '| seeds per variant:', len(seeds[variants[0]]))

# %% [markdown]
# ## 1. Residual-stream variance by depth, at init and after training
# `act_var` is the variance of the stream leaving each block (`layer_metrics.jsonl`; the
# step-0 record is taken before the first update).

# %%
def last_over_first(rung: str, metric: str, step) -> float:
  v = notebook.profile(layers, rung, metric, step)
  return v[-1] / v[0]


fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
for ax, step in zip(axes, ('first', 'last')):
  for v in variants:
    for i, r in enumerate(seeds[v]):
      prof = notebook.profile(layers, r, 'act_var', step)
      ax.semilogy(np.arange(1, len(prof) + 1), prof, color=f'C{variants.index(v)}',
                  alpha=0.8, label=v if i == 0 else None)
  ax.set(title=f'act_var at the {step} logged step', xlabel='block l')
axes[0].set_ylabel('variance of the stream leaving block l')
axes[0].legend()
notebook.save(fig, OUT, 'act_var_profiles')

growth = {v: {s: [last_over_first(r, 'act_var', s) for r in seeds[v]] for s in ('first', 'last')}
          for v in variants}
for v in variants:
  print(f'{v:>10}: act_var last/first block  init {notebook.mean_std(growth[v]["first"])}'
        f'   trained {notebook.mean_std(growth[v]["last"])}')

# %% [markdown]
# ## 2. Update ratio by depth after training
# `update_ratio` = mean over tokens of ||x_out - x_in|| / ||x_in||: how much block l changes
# the stream. Under the curse of depth the deep blocks barely change it.

# %%
fig, ax = plt.subplots(figsize=(5, 3.8))
for v in variants:
  for i, r in enumerate(seeds[v]):
    prof = notebook.profile(layers, r, 'update_ratio', 'last')
    ax.semilogy(np.arange(1, len(prof) + 1), prof, color=f'C{variants.index(v)}',
                label=v if i == 0 else None)
ax.set(xlabel='block l', ylabel='||x_out - x_in|| / ||x_in||', title='update ratio, trained')
ax.legend()
notebook.save(fig, OUT, 'update_ratio')


def late_over_second(rung: str) -> float:
  u = notebook.profile(layers, rung, 'update_ratio', 'last')
  return u[-4:].mean() / u[1]


update_drop = {v: [late_over_second(r) for r in seeds[v]] for v in variants}
for v in variants:
  print(f'{v:>10}: update ratio of the last 4 blocks / block 2: {notebook.mean_std(update_drop[v])}')

# %% [markdown]
# ## 3. Layer x step heatmap of the Pre-LN variance

# %%
pre = layers[(layers.rung == seeds['pre_ln'][0]) & (layers.metric == 'act_var')]
grid = pre.pivot(index='layer', columns='step', values='value')
fig, ax = plt.subplots(figsize=(6, 3.8))
im = ax.imshow(np.log10(grid.to_numpy()), aspect='auto', origin='lower',
               extent=(grid.columns.min(), grid.columns.max(), 0.5, len(grid) + 0.5))
fig.colorbar(im, label='log10 act_var')
ax.set(xlabel='step', ylabel='block l', title='Pre-LN act_var')
notebook.save(fig, OUT, 'act_var_heatmap')

# %% [markdown]
# ## 4. Skip-layer effect: which blocks matter
# `skip_delta_loss` (the analysis at the end of training): eval loss with block l replaced
# by the identity, minus the full model's loss (the papers' layer-removal experiment, on
# LM loss instead of benchmark scores).

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.8))
skip_gap = {}  # nats, first quarter minus last half (a ratio of near-zero means is unstable)
for v in variants:
  profs = np.array([notebook.profile(layers, r, 'skip_delta_loss', 'last') for r in seeds[v]])
  n = profs.shape[1]
  ax.semilogy(np.arange(1, n + 1), np.maximum(profs.mean(0), 1e-4), marker='o', label=v)
  skip_gap[v] = list(profs[:, : n // 4].mean(1) - profs[:, n // 2:].mean(1))
  print(f'{v:>10}: loss cost of skipping one block, first quarter '
        f'{notebook.mean_std(profs[:, : n // 4].mean(1))} nats, last half '
        f'{notebook.mean_std(profs[:, n // 2:].mean(1))} nats')
ax.set(xlabel='block l replaced by the identity', ylabel='eval loss increase (nats)',
       title='skip-one-block cost, trained')
ax.legend()
notebook.save(fig, OUT, 'skip_delta_loss')

# %% [markdown]
# ## 5. Mix-LN: gradient norms across depth (reported)
# Spread of the per-block gradient norms (largest / smallest block) at init and trained.

# %%
first_seed = {v: rs[0] for v, rs in seeds.items()}
for step in ('first', 'last'):
  notebook.save(notebook.profiles_figure(layers, first_seed, 'grad_norm', step,
                                         f'grad norm per block, {step} logged step'),
                OUT, f'grad_norm_{step}')
for v in variants:
  spread = [np.ptp(np.log10(notebook.profile(layers, r, 'grad_norm', 'last'))) for r in seeds[v]]
  print(f'{v:>10}: trained grad-norm spread across blocks, decades {notebook.mean_std(spread)}')

# %% [markdown]
# ## 6. Effective depth and loss (reported, not asserted)
# `python -m depthscale.compare DIR` gives the same table and plots.

# %%
table, pngs = compare.compare(LADDER, OUT)
print(table)
print('compare plots:', pngs)
losses = {v: [r['eval_loss'] for r in rows if r['rung'] in seeds[v]] for v in variants}
for v in variants:
  print(f'{v:>10}: final eval loss {notebook.mean_std(losses[v])}')

# %% [markdown]
# ## 7. Assertions on the mechanism
# Thresholds sit far outside the spread measured over seeds 0, 1, 2 at the `cpu` size
# (numbers in the README); CI runs seed 0 alone in smoke mode. The skip check is a
# difference in nats, SKIP_GAP: in smoke mode Pre-LN's first-quarter minus last-half skip
# cost was 0.075 nats (Mix-LN 0.0008; one run, no spread).

# %%
SKIP_GAP = 0.01  # nats


def depth_rank_correlation(values: np.ndarray) -> float:
  """Spearman correlation between a per-block profile and the block index."""
  return float(np.corrcoef(np.argsort(np.argsort(values)), np.arange(len(values)))[0, 1])


pre_growth = growth['pre_ln']
for step in ('first', 'last'):
  rho = [depth_rank_correlation(notebook.profile(layers, r, 'act_var', step)) for r in seeds['pre_ln']]
  assert min(rho) > 0.9, f'Pre-LN act_var is not increasing with depth ({step} step): rho {rho}'
assert min(pre_growth['first']) > 1.5, f'Pre-LN variance does not grow with depth at init: {pre_growth}'
assert min(pre_growth['last']) > 5.0, f'Pre-LN variance does not grow with depth after training: {pre_growth}'
assert max(update_drop['pre_ln']) < 0.6, f'Pre-LN deep blocks are not lazier: {update_drop["pre_ln"]}'
deep_var = {v: {s: [notebook.profile(layers, r, 'act_var', s)[-1] for r in seeds[v]]
                for s in ('first', 'last')} for v in ('pre_ln', 'lns')}
assert max(deep_var['lns']['first']) < min(deep_var['pre_ln']['first']), f'LNS init: {deep_var}'
assert max(deep_var['lns']['last']) < min(deep_var['pre_ln']['last']), f'LNS trained: {deep_var}'
assert 2 * max(growth['lns']['last']) < min(growth['pre_ln']['last']), f'LNS growth: {growth}'
assert min(skip_gap['pre_ln']) > SKIP_GAP, f'Pre-LN late blocks are not cheaper to skip: {skip_gap}'
print('mechanism assertions passed')

# %% [markdown]
# ## 8. This notebook's rows of the claims table (docs/claims.md)
# The verdicts that `depthscale.results.claims` gives from this ladder at the size it ran
# (mean final eval loss with a 95% Student-t interval over seeds per variant, and the
# row's rule). One seed (smoke) gives no interval, so nothing separates there. At `cpu`
# (3 seeds, beside other jobs at load average 4-13) neither separates either: LNS 2.360
# [2.319, 2.400] and Pre-LN 2.356 [2.308, 2.403]; Mix-LN 2.829 [2.127, 3.531], whose seeds
# spread widely at this notebook's one rate (3e-3).

# %%
from depthscale.results import claims

EXPECTED = {
    'smoke': {'Mix-LN outperforms Pre-LN': claims.NOT_AT_SIZE,
              'LayerNorm Scaling lowers the loss of Pre-LN': claims.NOT_AT_SIZE},
    'cpu': {'Mix-LN outperforms Pre-LN': claims.NOT_AT_SIZE,
            'LayerNorm Scaling lowers the loss of Pre-LN': claims.NOT_AT_SIZE},
}
verdicts = notebook.claims_rows('repro_curse_of_depth', SIZE, res, EXPECTED)

# %% [markdown]
# ## 9. The same on natural text: `python_docs`
# Pre-LN and LNS (one seed) trained on `data.source=python_docs`, the English prose that
# ships with Python (pydoc topics and standard-library docstrings, 2.1 MB, byte tokens;
# its sha256 is in every rung's `data_info.json`), same shapes and recipe as above
# (`repro_curse_of_depth.py:{SIZE}-text`), with an eval at every quarter of the steps.
# Reported next to the synthetic runs, not asserted; the eval loss and the ranking at 50%
# and 100% of the steps are printed first.
#
# **What changes on natural text** (measured at the `cpu` size: L 16, d 64, 300 steps,
# seed 0; synthetic numbers are the 3-seed means of sections 1-4):
# - At init the Pre-LN variance grows with depth as on synthetic data (last / first
#   block 18.5, synthetic 14.9 +- 0.5): at init the stream is set by the architecture.
# - Trained, it still grows monotonically with depth (act_var 3.0 at block 1 to 9.5 at
#   block 16), but the last / first ratio is 3.2 instead of 59 +- 7: on text block 1
#   writes a far larger update (update ratio 21 against the small embedding), so the
#   growth after it is flatter. The deep blocks are less lazy: update ratio of the last 4
#   blocks / block 2 is 0.32 (synthetic 0.14 +- 0.03).
# - The skip-one-block profile has the same shape: skipping block 1 costs 1.7 nats, one
#   of the first quarter 0.46 on average (synthetic 0.57), one of the last half 0.021
#   (synthetic 0.009); Pre-LN's skip effective depth is 6 of 16.
# - LNS keeps the variance flat (trained last / first 1.65, last block 1.8 against
#   Pre-LN's 9.5) and, unlike on the synthetic mix, lowers the eval loss: 2.33 against
#   2.47 nats per byte (a rerun with an eval at every quarter of the steps: 2.57 against
#   2.80 at half the steps, 2.32 against 2.52 at the end, skip effective depths 1 and 7).
#   Yet its last half costs nothing to skip (-0.001 nats) and its skip effective depth is
#   1: the better loss does not come from using the deep blocks more.
# One seed: differences of a few percent are within noise; the factor-20 change in the
# trained variance ratio and the LNS loss gap (0.14 and 0.20 nats in the two runs, 7-10x
# the synthetic runs' seed spread of 0.02) are unlikely to be.

# %%
_, text_res, text_seeds, _ = notebook.natural_text_run('../experiments/repro_curse_of_depth.py', SIZE, OUT)
text_layers = text_res.layers


def text_profile(variant: str, metric: str, step) -> np.ndarray:
  return notebook.profile(text_layers, text_seeds[variant][0], metric, step)


fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for v in text_seeds:
  for step, ls in (('first', ':'), ('last', '-')):
    prof = text_profile(v, 'act_var', step)
    axes[0].semilogy(np.arange(1, len(prof) + 1), prof, ls=ls, color=f'C{variants.index(v)}',
                     label=f'{v}, python_docs, {step} step')
  prof = notebook.profile(layers, seeds[v][0], 'act_var', 'last')
  axes[0].semilogy(np.arange(1, len(prof) + 1), prof, ls='--', color=f'C{variants.index(v)}',
                   alpha=0.5, label=f'{v}, synthetic, last step')
  skip_text = text_profile(v, 'skip_delta_loss', 'last')
  skip_syn = np.mean([notebook.profile(layers, r, 'skip_delta_loss', 'last') for r in seeds[v]], 0)
  n = len(skip_text)
  axes[1].semilogy(np.arange(1, n + 1), np.maximum(skip_text, 1e-4), marker='o',
                   color=f'C{variants.index(v)}', label=f'{v}, python_docs')
  axes[1].semilogy(np.arange(1, n + 1), np.maximum(skip_syn, 1e-4), ls='--', alpha=0.5,
                   color=f'C{variants.index(v)}', label=f'{v}, synthetic')
  init, trained = (text_profile(v, 'act_var', s) for s in ('first', 'last'))
  print(f'{v:>10} on python_docs: act_var last/first block init {init[-1] / init[0]:.1f} '
        f'(synthetic {notebook.mean_std(growth[v]["first"])}), trained '
        f'{trained[-1] / trained[0]:.1f} (synthetic {notebook.mean_std(growth[v]["last"])})')
  u = text_profile(v, 'update_ratio', 'last')
  print(f'{"":>10}  update ratio last 4 / block 2 {u[-4:].mean() / u[1]:.2f} (synthetic '
        f'{notebook.mean_std(update_drop[v])}); skip cost first quarter '
        f'{skip_text[: n // 4].mean():.3f} nats, last half {skip_text[n // 2:].mean():.3f} '
        f'(synthetic {skip_syn[: n // 4].mean():.3f}, {skip_syn[n // 2:].mean():.3f})')
axes[0].set(xlabel='block l', ylabel='act_var', title='stream variance by depth')
axes[1].set(xlabel='block l replaced by the identity', ylabel='eval loss increase (nats)',
            title='skip-one-block cost, trained')
axes[0].legend(fontsize=7)
axes[1].legend(fontsize=7)
notebook.save(fig, OUT, 'python_docs_vs_synthetic')
