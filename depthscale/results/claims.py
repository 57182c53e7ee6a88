"""The claims table: for every paper the notebooks address and every method of
docs/methods.md, the claim in one line, what the paper reports (number and model size),
the experiment that measures it here and the rule that turns measured final eval losses
into a verdict. `python -m depthscale.claims` fills in the measured columns from run
directories and writes docs/claims.md; nothing measured is typed in this file.

Measured values: the final eval losses of a ladder's finished rungs, grouped by variant
(the rung name without its seed part: 'post_ln_s2' -> 'post_ln', 'pre_ln_best_s1' ->
'pre_ln', 'pre_ln_s0_d64_L8' -> 'pre_ln_d64_L8'), as mean and 95% Student-t interval over
the seeds (intervals.t_interval). One seed gives no interval: nothing separates.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from depthscale.results import intervals
from depthscale.results.loader import Results

REPRODUCES, NOT_AT_SIZE = 'reproduces', 'does not at this size'
CONTRADICTS, NOT_MEASURED = 'contradicts', 'not measured'
VERDICTS = (REPRODUCES, NOT_AT_SIZE, CONTRADICTS, NOT_MEASURED)
NO_NUMBER = 'no number in the abstract (full paper not read here)'


def _order(stats: pd.DataFrame, a: str, b: str) -> int:
  """intervals.order of variants a and b's intervals in a variant_stats table."""
  return intervals.order(*(tuple(stats.loc[v, ['low', 'high']]) for v in (a, b)))


@dataclasses.dataclass(frozen=True)
class Below:
  """Variant a's final eval loss is below b's: reproduces where a's interval lies wholly
  below b's, contradicts where wholly above, does not at this size where they overlap."""
  a: str
  b: str

  def decide(self, stats: pd.DataFrame) -> str:
    o = _order(stats, self.a, self.b)
    return REPRODUCES if o < 0 else CONTRADICTS if o > 0 else NOT_AT_SIZE

  def describe(self) -> str:
    return f'{self.a} below {self.b}, intervals separated (above: contradicts; overlap: does not at this size)'


@dataclasses.dataclass(frozen=True)
class NotAbove:
  """Variant a matches or beats b: reproduces unless a's interval lies wholly above b's
  (contradicts)."""
  a: str
  b: str

  def decide(self, stats: pd.DataFrame) -> str:
    o = _order(stats, self.a, self.b)
    return CONTRADICTS if o > 0 else REPRODUCES

  def describe(self) -> str:
    return f'{self.a} not above {self.b} (intervals overlap or {self.a} below); above, separated: contradicts'


@dataclasses.dataclass(frozen=True)
class Claim:
  """One row: a method's claim in one line, the paper's number and size, and where and how
  it is measured (experiment file name without .py, and a rule over its variants)."""
  method: str
  paper: str
  claim: str
  reported: str
  experiment: str = ''
  rule: Below | NotAbove | None = None


XIONG = 'Xiong et al. 2020, arXiv 2002.04745'
DEEPNET = 'Wang et al. 2022 (DeepNet), arXiv 2203.00555'
MIXLN = 'Li et al. 2024 (Mix-LN), arXiv 2412.13795'
COD = 'Sun et al. 2025 (Curse of Depth), arXiv 2502.05795'
OSP = 'Park et al. 2025 (OSP)'
TLM = 'Bayat, Behrouz & Courville 2026, arXiv 2606.23670'
C = Claim
CLAIMS: tuple[Claim, ...] = (
    # the notebooks' papers: placements, warmup, depth
    C('Pre-LN', XIONG, 'without warmup at a large rate Post-LN trains far worse than Pre-LN',
      'Transformer-base (IWSLT14, WMT14), BERT-base; ' + NO_NUMBER, 'repro_pre_vs_post_ln',
      Below('pre_ln', 'post_ln')),
    C('Post-LN', XIONG, 'learning-rate warmup rescues Post-LN',
      'Transformer-base, 4,000-step warmup; ' + NO_NUMBER, 'repro_pre_vs_post_ln',
      Below('post_ln_warmup', 'post_ln')),
    C('Post-LN', DEEPNET, 'trained stably (each at its best rate), Post-LN ends below Pre-LN',
      'up to 1,000 layers; ' + NO_NUMBER, 'lr_sweep', Below('post_ln', 'pre_ln')),
    C('DeepNorm', DEEPNET, 'DeepNorm trains where Post-LN does not',
      '200 layers, 3.2B params: +5 BLEU over a 48-layer 12B model; trains 1,000 layers',
      'repro_pre_vs_post_ln', Below('deepnorm', 'post_ln')),
    C('DeepNorm', DEEPNET, 'DeepNorm keeps Post-LN\'s performance: below Pre-LN at each one\'s best rate',
      'up to 1,000 layers; ' + NO_NUMBER, 'lr_sweep', Below('deepnorm', 'pre_ln')),
    C('Keel', 'Chen & Wei 2026 (Post-LayerNorm Is Back)', 'Keel improves perplexity over Pre-LN',
      'beyond 1,000 layers; ' + NO_NUMBER, 'repro_pre_vs_post_ln', Below('keel', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Post-LN', '70M to 7B params; ' + NO_NUMBER,
      'repro_pre_vs_post_ln', Below('mix_ln', 'post_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Pre-LN', '70M to 7B params; ' + NO_NUMBER,
      'repro_curse_of_depth', Below('mix_ln', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Pre-LN, each at its best rate', '70M to 7B params; ' + NO_NUMBER,
      'lr_sweep', Below('mix_ln', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Post-LN, each at its best rate', '70M to 7B params; ' + NO_NUMBER,
      'lr_sweep', Below('mix_ln', 'post_ln')),
    C('LayerNorm Scaling', COD, 'LayerNorm Scaling lowers the loss of Pre-LN',
      '130M to 1B params; ' + NO_NUMBER, 'repro_curse_of_depth', Below('lns', 'pre_ln')),
    C('DyT', 'Zhu et al. 2025, arXiv 2503.10622', 'DyT matches or exceeds LayerNorm',
      NO_NUMBER, 'repro_norm_free', NotAbove('dyt', 'layernorm')),
    C('Derf', 'Chen et al. 2025 (Derf)', 'Derf outperforms LayerNorm', NO_NUMBER,
      'repro_norm_free', Below('derf', 'layernorm')),
    C('Derf', 'Chen et al. 2025 (Derf)', 'Derf outperforms DyT', NO_NUMBER, 'repro_norm_free',
      Below('derf', 'dyt')),
    C('DyT', 'DyT is regime-dependent (2026)', 'DyT helps at small token budgets, hurts at large',
      'GPT-2 64M: -27.3% val loss at 1M tokens, +18.8% at 118M'),
    C('ProRes', 'Chen et al. 2026 (ProRes)', 'progressive residual warmup lowers the final loss',
      NO_NUMBER, 'repro_training_dynamics', Below('prores', 'pre_ln')),
    C('LayerDrop', 'Fan et al. 2019 (LayerDrop)', 'LayerDrop regularizes: lower final loss',
      NO_NUMBER, 'repro_training_dynamics', Below('layerdrop', 'pre_ln')),
    C('LayerSkip', 'Elhoushi et al. 2024 (LayerSkip)', 'layer dropout plus early-exit loss makes early exits accurate',
      'Llama models; self-speculative decoding up to 2.16x faster'),
    C('Hyper-connections (static / dynamic)', 'Zhu et al. 2024, arXiv 2409.19606',
      'hyper-connections beat the standard residual at equal size', NO_NUMBER,
      'repro_width_depth_ladder', Below('hyper_connections_d64_L8', 'pre_ln_d64_L8')),
    C('AttnRes / Block AttnRes', 'Kimi 2026, arXiv 2603.15031',
      'attention over earlier layers beats the fixed residual sum', NO_NUMBER,
      'repro_width_depth_ladder', Below('attn_res_d64_L8', 'pre_ln_d64_L8')),
    C('DenseFormer (DWA)', 'Pagliardini et al. 2024 (DenseFormer)',
      'depth-weighted averages of past block outputs lower the loss', NO_NUMBER,
      'repro_width_depth_ladder', Below('denseformer_d64_L8', 'pre_ln_d64_L8')),
    C('depth-muP', 'Yang et al. 2023 (Tensor Programs VI)', 'the optimal learning rate transfers across depth',
      NO_NUMBER),
    C('depth-muP', 'Bordelon et al. 2023 (depthwise hyperparameter transfer)',
      '1/sqrt(L) branch scaling makes the optimal rate transfer across depth', NO_NUMBER),
    C('Pre-LN', 'DepthBench 2026', 'at a fixed size, deep-narrow Pre-LN gains little or loses against wide-shallow',
      '10 architectures at fixed size; ' + NO_NUMBER, 'repro_width_depth_ladder',
      NotAbove('pre_ln_d128_L2', 'pre_ln_d32_L32')),
    C('CompleteP', 'Dey et al. 2025 (CompleteP)', 'alpha = 1 transfers hyperparameters across depth and trains deep models compute-efficiently',
      NO_NUMBER),
    # every other method of docs/methods.md
    C('Peri-LN', 'Kim et al. 2025 (Peri-LN)', 'Peri-LN balances variance growth and trains better than Pre-LN',
      'up to 3.2B params; ' + NO_NUMBER, 'norm_placement', Below('peri_ln_L8', 'pre_ln_L8')),
    C('Sandwich-LN', 'Ding et al. 2021 (CogView)', 'sandwich norms stabilize training', NO_NUMBER,
      'norm_placement', NotAbove('sandwich_ln_L8', 'pre_ln_L8')),
    C('Sub-LN (Magneto)', 'Wang et al. 2022 (Foundation Transformers)', 'Sub-LN performs better than the usual placements',
      NO_NUMBER, 'norm_placement', Below('sub_ln_L8', 'pre_ln_L8')),
    C('NormFormer', 'Shleifer et al. 2021 (NormFormer)', 'extra norms improve Pre-LN pre-training perplexity',
      '1.3B: equal perplexity 24% faster, 0.27 lower perplexity at equal compute',
      'norm_placement', Below('normformer_L8', 'pre_ln_L8')),
    C('HybridNorm', 'Zhuo et al. 2025 (HybridNorm)', 'HybridNorm outperforms Pre-Norm and Post-Norm',
      NO_NUMBER, 'norm_placement', Below('hybridnorm_L8', 'pre_ln_L8')),
    C('HybridNorm*', 'Zhuo et al. 2025 (HybridNorm)', 'HybridNorm* outperforms Pre-Norm', NO_NUMBER,
      'norm_placement', Below('hybridnorm_star_L8', 'pre_ln_L8')),
    C('BranchNorm (reconstruction from the abstract)', 'Liu et al. 2023 (BranchNorm)',
      'better stability/convergence trade-off than DeepNorm', 'translation; ' + NO_NUMBER,
      'norm_placement', Below('branchnorm_L8', 'deepnorm_L8')),
    C('nGPT', 'Loshchilov et al. 2024 (nGPT)', 'nGPT reaches the same accuracy in fewer steps',
      '4x to 20x fewer steps, depending on sequence length'),
    C('SimpleNorm', 'Chen et al. 2026 (SimpleGPT)', 'SimpleNorm tolerates larger rates and ends lower',
      '7B, 60K steps: train loss 2.208 vs 2.290 (LLaMA2 with QK-norm); rates 3x-10x larger'),
    C('GPAS', 'Chen et al. 2025 (GPAS)', 'GPAS improves Pre-LN', '71M to 1B params; ' + NO_NUMBER),
    C('QK-norm', 'Henry et al. 2020 (QKNorm); OLMo 2', 'normalized queries and keys avoid softmax saturation',
      'low-resource translation: +0.928 BLEU on average'),
    C('LayerRoPE (interpretation)', 'LayerRoPE 2026', 'LayerRoPE beats Pre-, Post-, Peri-LN and LNS',
      "Pre-Norm's 1.3B loss with 3.4x less compute; up to 512 layers"),
    C('LayerNorm', 'Ba et al. 2016', 'normalization stabilizes and speeds up training', NO_NUMBER),
    C('RMSNorm', 'Zhang & Sennrich 2019, arXiv 1910.07467', 'RMSNorm performs comparably to LayerNorm',
      'comparable quality, 7% to 64% faster', 'norm_free', NotAbove('rmsnorm_L8', 'layernorm_L8')),
    C('CRMSNorm (Pre-CRMSNorm)', 'Jiang et al. 2023, arXiv 2305.14858',
      'Pre-LN, Pre-RMSNorm and Pre-CRMSNorm are equivalent', '1% to 10% faster; exact equivalence',
      'mlp_variants', NotAbove('crms_gelu', 'ln_gelu')),
    C('ScaleNorm', 'Nguyen & Salazar 2019', 'ScaleNorm trains faster and better',
      'five low-resource pairs: +1.1 BLEU on average (with PreNorm and FixNorm)'),
    C('FixNorm', 'Nguyen & Salazar 2019', 'fixed-length word embeddings help', 'see ScaleNorm'),
    C('BHyT (star)', 'Byun et al. 2026 (BHyT)', 'BHyT matches RMSNorm and trains faster',
      '15.8% faster training, 4.2% higher generation throughput than RMSNorm'),
    C('SeeDNorm', 'Cai et al. 2025 (SeeDNorm)', 'SeeDNorm outperforms RMSNorm, LayerNorm and DyT', NO_NUMBER),
    C('none', '(norm-free studies)', 'reference: no normalization', 'not a claim'),
    C('GELU (tanh form)', 'Hendrycks & Gimpel 2016', 'reference activation', 'not a claim'),
    C('ReLU', 'Jha & Reagen 2024, arXiv 2410.09637', 'without LayerNorm, ReLU beats GELU',
      '8.2% perplexity improvement', 'mlp_variants', Below('none_relu', 'none_gelu')),
    C('squared ReLU', 'So et al. 2021 (Primer), arXiv 2109.08668', 'squared ReLU improves language modelling',
      NO_NUMBER, 'mlp_variants', Below('none_relu2', 'none_gelu')),
    C('SwiGLU', 'Shazeer 2020', 'gated MLPs improve perplexity', NO_NUMBER),
    C('tapered MLP width (reconstruction)', TLM, 'earlier-heavy MLP widths beat uniform widths at a fixed budget',
      NO_NUMBER, 'mlp_variants', Below('taper_cosine', 'ln_gelu')),
    C('tapered MLP width (reconstruction)', TLM, 'the reverse allocation hurts', NO_NUMBER,
      'mlp_variants', Below('ln_gelu', 'taper_reverse')),
    C('muP (Adam)', 'Yang et al. 2022 (Tensor Programs V)', 'the optimal learning rate transfers across width', NO_NUMBER),
    C('init: normal / xavier / small_init / depth_scaled', 'GPT-2; Glorot & Bengio 2010; Nguyen & Salazar 2019',
      'reference inits', 'not a claim'),
    C('init: deepnorm', DEEPNET, 'see DeepNorm', 'see DeepNorm'),
    C('DeepScaleLM', 'Kedia et al. 2024 (DeepScaleLM)', 'deeper models with fewer parameters beat shallow ones',
      '100s of layers; ' + NO_NUMBER),
    C('Q/K slow-down', 'arXiv 2605.10504', 'slowing upper-layer Q/K early improves final perplexity', NO_NUMBER),
    C('LLR', 'arXiv 2605.22297', 'layer-wise rates from heavy-tailedness converge faster',
      '60M to 3B params, up to 100B tokens; ' + NO_NUMBER),
    C('AdamW', 'Loshchilov & Hutter 2019', 'reference optimizer', 'not a claim'),
    C('Muon', 'Jordan et al. 2024; Park et al. 2025 (OSP)', 'Muon trains without outlier channels',
      '1.4B, 1T tokens: excess kurtosis 0.04 vs 1818.56 (with the two OSP parts below)'),
    C('single-scale RMSNorm', OSP, 'one scale prevents channel-wise amplification', 'see Muon'),
    C('embedding projection', OSP, 'a learned projection spreads embedding outliers', 'see Muon'),
    C('standard residual', 'He et al. 2016', 'reference residual', 'not a claim'),
    C('mHC', 'Xie et al. 2025, arXiv 2512.24880', 'manifold-constrained hyper-connections train stably and better',
      NO_NUMBER),
    C('LAuReL RW / LR / PA / RW+LR', 'Menghani et al. 2025, arXiv 2411.07501',
      'a learned residual beats the standard one at almost no cost',
      'ResNet-50 ImageNet: 60% of the gain of an extra layer for 0.003% more params'),
    C('ResFormer / SVFormer / SATFormer', 'Zhou et al. 2024, arXiv 2410.17897; arXiv 2605.03953',
      'value residuals lower the loss', NO_NUMBER),
    C('Parallel block', 'GPT-J, PaLM; GPT-NeoX', 'parallel attention and MLP match the serial block', NO_NUMBER),
    C('MoDA', 'MoDA (hustvl), arXiv 2603.15619', 'attending to earlier layers lowers the loss', NO_NUMBER),
    C('Layer pruning with healing', 'Gromov et al. 2024, arXiv 2403.17887',
      'deep layers can be pruned with little loss after healing', NO_NUMBER),
    C('Removing the norms by fine-tuning', 'Heimersheim 2024, arXiv 2409.13710',
      'LayerNorm can be removed from GPT-2 by fine-tuning', 'GPT-2 small: +0.05 cross-entropy after 500M tokens'),
    C('Linear maps across depth', 'Csordás et al. 2025, arXiv 2505.13898',
      'second-half layers contribute little', NO_NUMBER),
    C('Recurrence (layer tying, Universal-Transformer depth)', 'Dehghani et al. 2018, arXiv 1807.03819',
      'a looped block matches a deeper unique stack', NO_NUMBER, 'recurrence',
      NotAbove('loop_U2xK3', 'unique_L6')),
    C('Relaxed Recursive Transformer', 'Bae et al. 2024, arXiv 2410.20672',
      'per-loop LoRA improves a looped model', 'recursive Gemma 1B; ' + NO_NUMBER, 'recurrence',
      Below('relaxed_U2xK3', 'loop_U2xK3')),
)


def variant_stats(res: Results) -> pd.DataFrame:
  """Per variant (index): seeds, mean, low, high (final eval loss, 95% Student-t), lr,
  L, D, params (non-embedding), tokens, data."""
  cfg = res.configs.set_index('rung')
  rows = []
  for v, g in res.summaries.groupby(res.summaries.rung.map(intervals.variant), sort=False):
    mean, low, high = intervals.t_interval(g.final_eval_loss)
    c = cfg.loc[g.rung.iloc[0]]
    rows.append({'variant': v, 'seeds': len(g), 'mean': mean, 'low': low, 'high': high,
                 'lr': c['optim.lr'] if cfg.loc[g.rung, 'optim.lr'].nunique() == 1 else np.nan,
                 'L': int(c['model.num_layers']), 'D': int(c['model.d_model']),
                 'params': int(g.non_embedding_params.iloc[0]), 'tokens': int(g.tokens.iloc[0]),
                 'data': c['data.source']})
  return pd.DataFrame(rows).set_index('variant') if rows else pd.DataFrame()


def verdict(claim: Claim, stats: pd.DataFrame | None) -> str:
  """The claim's verdict from one ladder's variant_stats (None: not run)."""
  if claim.rule is None or stats is None or not {claim.rule.a, claim.rule.b} <= set(stats.index):
    return NOT_MEASURED
  return claim.rule.decide(stats)


def evaluate(runs: dict[tuple[str, str], Results],
             table: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
  """One row per (claim, run of its experiment), or one 'not measured' row per claim with
  none: method, paper, claim, reported, measured_by (experiment:size), rule, size, data,
  tokens, measured (mean [interval] per variant), verdict. runs: (experiment, size) -> its
  loaded ladder."""
  stats = {key: variant_stats(res) for key, res in runs.items()}
  rows = []
  for c in table:
    base = {'method': c.method, 'paper': c.paper, 'claim': c.claim, 'reported': c.reported,
            'rule': c.rule.describe() if c.rule else 'no experiment measures it yet'}
    found = [(size, s) for (exp, size), s in stats.items() if exp == c.experiment]
    for size, s in found or [('', None)]:
      v = verdict(c, s)
      row = {**base, 'measured_by': f'{c.experiment}:{size}' if size else c.experiment or '-',
             'size': '-', 'data': '-', 'tokens': '-', 'measured': '-', 'verdict': v}
      if v != NOT_MEASURED:
        a = s.loc[c.rule.a]
        row.update(size=f'L{a.L} d{a.D}, {a.params:,} non-emb params', data=a.data,
                   tokens=f'{a.tokens:,} ({a.tokens / a.params:.2g}/param)',
                   measured='; '.join(_measured(n, s.loc[n]) for n in (c.rule.a, c.rule.b)))
      rows.append(row)
  return pd.DataFrame(rows)


def _measured(name: str, s: pd.Series) -> str:
  interval = f' [{s.low:.3f}, {s.high:.3f}]' if s.seeds > 1 else ''
  return f'{name} {s["mean"]:.3f}{interval} ({s.seeds} seed{"s" if s.seeds > 1 else ""}, lr {s.lr:g})'


COLUMNS = ('method', 'paper', 'claim', 'reported', 'measured_by', 'size', 'data', 'tokens',
           'measured', 'verdict', 'rule')


def markdown(table: pd.DataFrame, note: str = '') -> str:
  """docs/claims.md: how it is made, the runs it read (and `note`: machine, load), then
  the table."""
  head = ['# Claims and verdicts', '',
          'Generated by `python -m depthscale.claims` from run directories: do not edit by hand.',
          'Each row: a claim of a paper, what the paper reports (from its abstract unless said',
          'otherwise), the run that measures it here (experiment file and size), the measured',
          'final eval loss per variant as mean and 95% Student-t interval over seeds, and the',
          'verdict that the row\'s rule gives. Verdicts: reproduces; does not at this size',
          '(intervals overlap: nothing separates at this size and seed count); contradicts;',
          'not measured (no run given, or its ladder lacks the variants). The claims, papers\'',
          'numbers and rules live in `depthscale/results/claims.py`.', '',
          'Runs read: ' + (', '.join(sorted({m for m in table.measured_by if ':' in m})) or 'none')
          + (f'. {note}' if note else '') + '.', '']
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  for _, r in table.iterrows():
    lines.append('| ' + ' | '.join(str(r[c]).replace('|', '/') for c in COLUMNS) + ' |')
  return '\n'.join(head + lines) + '\n'
