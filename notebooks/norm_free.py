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
# # Transformers without normalization: DyT and Derf vs LayerNorm
#
# **Claim.** An element-wise squashing function can replace every normalization layer of
# a Transformer: DyT(x) = g * tanh(alpha x) + b, and Derf(x) = g * erf(alpha x + s) + b.
# The bounding is what does the work: how many units saturate depends on the regime
# (model size vs data), which decides whether DyT helps or hurts.
#
# **Papers.** Zhu et al. 2025, *Transformers without Normalization* (DyT); Chen et al.
# 2025, *Stronger Normalization-Free Transformers* (Derf); *DyT is regime-dependent* (2026).
#
# **Reported.** DyT matches or exceeds normalized Transformers across vision, language and
# speech, mostly without tuning (DyT paper). Derf outperforms LayerNorm, RMSNorm and DyT
# across vision, speech and DNA models (Derf paper). DyT improves validation loss by 27.3%
# at 64M parameters / 1M tokens but worsens it by 18.8% at 64M / 118M tokens; 49% of DyT
# activations saturate at 1M tokens versus 23% at 118M (regime paper).
#
# **Full-size configuration.** The DyT paper's LLaMA experiments train 7B-70B models; the
# regime paper's GPT-2 family spans 64M-3.78B parameters and 1M-118M tokens.
# `SIZE = 'paper'` selects GPT-2 small (L 12, d 768, learned positions, GPT-2's 50,304-token
# vocabulary; seq 1024, batch 512, 20k steps); experiments/repro_norm_free.py gives the
# `prepare` command for a corpus. The default `cpu` size is L 8, d 64,
# 300 steps, 3 seeds; `DEPTHSCALE_SMOKE=1` shrinks it.
#
# **What this notebook asserts.** DyT and Derf train without any normalization: eval loss
# more than UNIGRAM_MARGIN below the unigram entropy of the data (the loss of a model that
# ignores the context, which a 1-nat drop from the init loss of ln 256 would still allow);
# their saturated fraction per block
# (share of |tanh| or |erf| above 0.99) starts near 0 at init and becomes substantial
# during training: the bounding is active. Loss rankings are reported, not asserted; the
# notebook's rows of the claims table (docs/claims.md) get the verdicts expected at the
# size it ran. On natural text (section 6) the ranking at 50% and 100% of the steps is
# reported.
# Seeds: 0, 1, 2 at the `cpu` size; seed 0 alone in smoke mode (CI), where the unigram
# entropy is 4.38 and DyT / Derf reached 4.07 / 4.06 (one run, no spread).
#
# **Measured at the `cpu` size (3 seeds, alpha0 = 1 everywhere, 508 s with another notebook
# running).** Eval loss LayerNorm 2.35 +- 0.02, DyT 3.71 +- 0.01, Derf 3.71 +- 0.01; mean
# saturated fraction 0 at init, 0.87 +- 0.02 (DyT) and 0.90 +- 0.02 (Derf) after 300
# steps. The paper's "matches LayerNorm" does not reproduce here: at alpha0 = 1 almost
# every unit ends saturated and the loss stalls ~1.4 nats above LayerNorm's. The papers
# give no alpha0 below width 4096 (wider: smaller); sweep `model.norm_alpha_*` first.

# %%
import matplotlib.pyplot as plt
import numpy as np

from depthscale import data
from depthscale.experiment import resolve
from depthscale.results import notebook

SIZE = 'smoke' if notebook.smoke() else 'cpu'  # 'paper': the full-size ladder (accelerator)
OUT = notebook.outputs('norm_free')
LADDER = f'{OUT}/runs_{SIZE}'
EXPERIMENT = f'../experiments/repro_norm_free.py:{SIZE}'
rows, res, seeds = notebook.run(EXPERIMENT, LADDER)
layers = res.layers
variants = list(seeds)
print('variants:', variants, '| seeds per variant:', len(seeds[variants[0]]))

# %% [markdown]
# ## 1. Loss curves (reported, not asserted)

# %%
notebook.save(notebook.loss_curves(res.scalars, seeds, 'LayerNorm vs DyT vs Derf'), OUT, 'loss_curves')
losses = {v: [r['eval_loss'] for r in rows if r['rung'] in seeds[v]] for v in variants}
for v in variants:
  print(f'{v:>10}: final eval loss {notebook.mean_std(losses[v])}')

# %% [markdown]
# ## 2. Saturation per block over training
# `saturation`: mean over the block's DyT/Derf units of the fraction with |tanh| (|erf|)
# above 0.99.

# %%
squashers = [v for v in variants if v != 'layernorm']
fig, axes = plt.subplots(1, len(squashers), figsize=(5 * len(squashers), 3.6), squeeze=False)
sat = {}
for ax, v in zip(axes[0], squashers):
  df = layers[(layers.rung == seeds[v][0]) & (layers.metric == 'saturation')]
  grid = df.pivot(index='layer', columns='step', values='value')
  im = ax.imshow(grid.to_numpy(), aspect='auto', origin='lower', vmin=0, vmax=1,
                 extent=(grid.columns.min(), grid.columns.max(), 0.5, len(grid) + 0.5))
  ax.set(title=f'{v}: saturated fraction', xlabel='step', ylabel='block l')
  sat[v] = {s: [notebook.profile(layers, r, 'saturation', s).mean() for r in seeds[v]]
            for s in ('first', 'last')}
  print(f'{v:>10}: mean saturated fraction  init {notebook.mean_std(sat[v]["first"])}'
        f'   trained {notebook.mean_std(sat[v]["last"])}')
fig.colorbar(im, ax=axes[0].tolist())
notebook.save(fig, OUT, 'saturation_heatmaps')

# %% [markdown]
# ## 3. Residual-stream variance by depth (reported)

# %%
first_seed = {v: rs[0] for v, rs in seeds.items()}
notebook.save(notebook.profiles_figure(layers, first_seed, 'act_var', 'last', 'stream variance, trained'),
              OUT, 'act_var')

# %% [markdown]
# ## 4. Assertions on the mechanism

# %%
assert 'saturation' not in set(layers[layers.rung.isin(seeds['layernorm'])].metric)
(_, cfg), *_ = resolve(EXPERIMENT)
targets = np.concatenate([b['targets'][b['weights'] > 0]
                          for b in data.eval_batches(cfg.data, 0, 32)])
freq = np.bincount(targets) / len(targets)
unigram_entropy = float(-(freq[freq > 0] * np.log(freq[freq > 0])).sum())
UNIGRAM_MARGIN = 0.15  # nats
eval_loss = {r['rung']: r['eval_loss'] for r in rows}
print(f'unigram entropy {unigram_entropy:.3f}; eval loss', eval_loss)
for v in squashers:
  assert all(eval_loss[r] < unigram_entropy - UNIGRAM_MARGIN for r in seeds[v]), (
      f'{v} does not beat the unigram entropy {unigram_entropy:.3f}: {losses}')
  assert max(sat[v]['first']) < 0.05, f'{v} saturates at init: {sat}'
  assert min(sat[v]['last']) > 0.2, f'{v} does not saturate during training: {sat}'
print('mechanism assertions passed')


# %% [markdown]
# ## 5. This notebook's rows of the claims table (docs/claims.md)
# The verdicts that `depthscale.results.claims` gives from this ladder at the size it ran
# (mean final eval loss with a 95% Student-t interval over seeds per variant, and the
# row's rule). One seed (smoke) gives no interval: nothing separates, so "DyT matches or
# exceeds LayerNorm" (DyT not above LayerNorm) holds and the Derf rows do not at this
# size. At `cpu` (3 seeds, measured beside other jobs at load average 11-13) every norm
# trains at this notebook's one rate, 3e-3, where DyT (3.711 [3.687, 3.734]) and Derf
# (3.710 [3.685, 3.735]) stay near the level where Post-LN stalls on the same data
# (3.72 in notebooks/pre_vs_post_ln.py), far above
# LayerNorm (2.348 [2.289, 2.408]): both LayerNorm rows contradict the papers at this rate,
# and Derf and DyT tie. The rate is the explanation: at each norm's own best rate
# (experiments/method_survey.py, python_docs) DyT is not above LayerNorm and the Derf rows
# do not separate (the "each at its best rate" rows of docs/claims.md).

# %%
from depthscale.results import claims

EXPECTED = {
    'smoke': {'DyT matches or exceeds LayerNorm': claims.REPRODUCES,
              'Derf outperforms LayerNorm': claims.NOT_AT_SIZE,
              'Derf outperforms DyT': claims.NOT_AT_SIZE},
    'cpu': {'DyT matches or exceeds LayerNorm': claims.CONTRADICTS,
            'Derf outperforms LayerNorm': claims.CONTRADICTS,
            'Derf outperforms DyT': claims.NOT_AT_SIZE},
}
verdicts = notebook.claims_rows('repro_norm_free', SIZE, res, EXPECTED)

# %% [markdown]
# ## 6. On natural text: `python_docs`
# Seed 0 of LayerNorm, DyT and Derf (smoke: DyT only) trained on the English
# prose that ships with Python (byte tokens; `repro_norm_free.py:{SIZE}-text`), same
# shapes and recipe as above, with an eval at every quarter of the steps: each variant's
# eval loss and its ranking at 50% and at 100% of the steps. Reported, not asserted.

# %%
text_rows, text_res, text_groups, text_rank = notebook.natural_text_run(
    '../experiments/repro_norm_free.py', SIZE, OUT)
