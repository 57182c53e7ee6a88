"""The claims table: for every paper the notebooks address and every method of
docs/methods.md, the claim in one line, what the paper reports (number and model size),
the experiment that measures it here and the rule that turns measured final eval losses
into a verdict. `python -m depthscale.claims` fills in the measured columns from run
directories and writes docs/claims.md; nothing measured is typed in this file.

Measured values: the final eval losses of a ladder's finished rungs, grouped by variant
(the rung name without its seed part: 'post_ln_s2' -> 'post_ln', 'pre_ln_best_s1' ->
'pre_ln', 'pre_ln_s0_d64_L8' -> 'pre_ln_d64_L8'; of a sweep's finalist rates, the one with
the lowest mean), as mean and 95% Student-t interval over the seeds (intervals.t_interval).
Verdicts over two variants are paired: seed k sees the same batches in every variant of a
ladder, so the rule reads the 95% t-interval of the per-seed differences a - b over the seeds
both have (intervals.paired_interval); only where fewer than 2 seeds pair does it compare the
two unpaired intervals. One seed gives no interval: nothing separates.
"""

from __future__ import annotations

import collections
import dataclasses
import re

import numpy as np
import pandas as pd

from depthscale.results import intervals, papers
from depthscale.results.papers import NO_NUMBER, SECONDARY  # pylint: disable=unused-import
from depthscale.results.loader import Results

REPRODUCES, NOT_AT_SIZE = 'reproduces', 'does not at this size'
CONTRADICTS, NOT_MEASURED = 'contradicts', 'not measured'
MEASURED = 'measured, no verdict'
VERDICTS = (REPRODUCES, NOT_AT_SIZE, CONTRADICTS, MEASURED, NOT_MEASURED)
LOSS = 'final_eval_loss'
AXES = {'L': 'depth', 'd': 'width'}  # Transfers.axis: the rung-name prefix of the size


def difference(stats: pd.DataFrame, a: str, b: str) -> tuple[float, float, float, int] | None:
  """(mean, low, high, pairs) of the per-seed differences a - b over the seeds both variants of
  a variant_stats table have; None where fewer than 2 pair."""
  sa, sb = stats.loc[a, 'by_seed'], stats.loc[b, 'by_seed']
  common = sorted(set(sa) & set(sb))
  if len(common) < 2:
    return None
  return (*intervals.paired_interval([sa[k] for k in common], [sb[k] for k in common]),
          len(common))


def _order(stats: pd.DataFrame, a: str, b: str) -> int:
  """-1 / 1 where a lies below / above b, 0 where nothing separates: the paired interval of
  a - b against 0, or intervals.order of the unpaired intervals where the seeds do not pair."""
  d = difference(stats, a, b)
  if d is not None:
    return -1 if d[2] < 0 else 1 if d[1] > 0 else 0
  return intervals.order(*(tuple(stats.loc[v, ['low', 'high']]) for v in (a, b)))


def gap(stats: pd.DataFrame, a: str, b: str) -> str:
  """'a - b +0.012 [-0.03, 0.05] (3 paired seeds)', or the difference of means (unpaired)."""
  d = difference(stats, a, b)
  if d is None:
    return f'{a} - {b} {stats.loc[a, "mean"] - stats.loc[b, "mean"]:+.3f} (unpaired)'
  return f'{a} - {b} {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] ({d[3]} paired seeds)'


@dataclasses.dataclass(frozen=True)
class _Pair:
  """A rule over two variants a and b, both shown in the row."""
  a: str
  b: str

  def shown(self, stats: pd.DataFrame) -> list[str]:
    del stats
    return [self.a, self.b]

  def gap(self, stats: pd.DataFrame) -> str:
    return gap(stats, self.a, self.b)


@dataclasses.dataclass(frozen=True)
class Below(_Pair):
  """Variant a's final eval loss is below b's: reproduces where a - b separates below 0
  (_order), contradicts where above, does not at this size where nothing separates."""

  def decide(self, stats: pd.DataFrame) -> str:
    o = _order(stats, self.a, self.b)
    return REPRODUCES if o < 0 else CONTRADICTS if o > 0 else NOT_AT_SIZE

  def describe(self) -> str:
    return f'{self.a} below {self.b}, separated (above: contradicts; not separated: does not at this size)'


@dataclasses.dataclass(frozen=True)
class NotAbove(_Pair):
  """Variant a matches or beats b: reproduces unless a separates above b (contradicts)."""

  def decide(self, stats: pd.DataFrame) -> str:
    o = _order(stats, self.a, self.b)
    return CONTRADICTS if o > 0 else REPRODUCES

  def describe(self) -> str:
    return f'{self.a} not above {self.b} (not separated, or {self.a} below); above, separated: contradicts'


@dataclasses.dataclass(frozen=True)
class Reference(_Pair):
  """No verdict to decide (a reference method, a claim about something other than the final
  loss, or a one-seed run): the row shows a's and b's measured values."""

  def decide(self, stats: pd.DataFrame) -> str:
    del stats
    return MEASURED

  def describe(self) -> str:
    return f'{self.a} beside {self.b}: no verdict (not a loss claim, or one seed)'


@dataclasses.dataclass(frozen=True)
class Both:
  """Two Below rules that must hold together (a claim over two regimes, e.g. a below b at a
  small budget and above it at a large one): reproduces where both do, contradicts where
  either separates the other way, does not at this size otherwise (an overlap)."""
  first: Below
  second: Below

  def shown(self, stats: pd.DataFrame) -> list[str]:
    return self.first.shown(stats) + self.second.shown(stats)

  def gap(self, stats: pd.DataFrame) -> str:
    return f'{self.first.gap(stats)}; {self.second.gap(stats)}'

  def decide(self, stats: pd.DataFrame) -> str:
    verdicts = {self.first.decide(stats), self.second.decide(stats)}
    return (CONTRADICTS if CONTRADICTS in verdicts else
            REPRODUCES if verdicts == {REPRODUCES} else NOT_AT_SIZE)

  def describe(self) -> str:
    return (f'{self.first.a} below {self.first.b} and {self.second.a} below {self.second.b}, '
            'separated (either the other way: contradicts; one not separated: does not at this size)')


@dataclasses.dataclass(frozen=True)
class Wider(_Pair):
  """Variant a trains well over a wider range of learning rates than b (rate sensitivity):
  of each one's stage-1 rates (ladder.lr_sweep, seed 0, extensions included), those whose
  final loss is within `within` (relative) of that variant's best; reproduces where a has
  more of them, contradicts where fewer, does not at this size where as many (one seed per
  rate: no interval)."""
  within: float = 0.05

  def near(self, stats: pd.DataFrame, v: str) -> list[float]:
    rows = stats[stats.index.str.fullmatch(rf'{re.escape(v)}_lr(\d.*|_ext\d+)')]
    return sorted(rows.lr[rows['mean'] <= rows['mean'].min() * (1 + self.within)])

  def shown(self, stats: pd.DataFrame) -> list[str]:
    return [self.a, self.b] if self.near(stats, self.a) and self.near(stats, self.b) else []

  def decide(self, stats: pd.DataFrame) -> str:
    na, nb = len(self.near(stats, self.a)), len(self.near(stats, self.b))
    return REPRODUCES if na > nb else CONTRADICTS if na < nb else NOT_AT_SIZE

  def describe(self) -> str:
    return (f'{self.a} within {self.within:.0%} of its best at more stage-1 rates than {self.b} '
            '(fewer: contradicts; as many: does not at this size)')

  def gap(self, stats: pd.DataFrame) -> str:
    return '; '.join(f'{v} within {self.within:.0%} at ' + ', '.join(f'{r:g}' for r in self.near(stats, v))
                     for v in (self.a, self.b))


@dataclasses.dataclass(frozen=True)
class Transfers:
  """The loss-minimizing rate of a family's rungs '<family>_<axis><size>_lr<rate>' is the same
  at every size along the axis (AXES: 'L' depth, 'd' width). At each size the rates tied with
  the best (lowest mean) are those whose paired per-seed difference from it does not
  separate from 0 (_order; with one seed only the best itself). Reproduces where one rate is
  tied with the best at every size; does not at this size where the tied sets are one step
  of the rate grid apart (the grid cannot tell); contradicts where further. Rungs named along
  the other axis do not count."""
  family: str
  axis: str = 'L'

  def __post_init__(self):
    if self.axis not in AXES:
      raise ValueError(f'Transfers.axis={self.axis!r}: allowed {", ".join(AXES)}')

  def _runs(self, stats: pd.DataFrame) -> dict[int, list[tuple[float, float, str]]]:
    """size -> [(mean loss, rate, rung)] over the family's rungs along the axis in stats."""
    runs = collections.defaultdict(list)
    for name in stats.index:
      m = re.fullmatch(rf'{re.escape(self.family)}_{self.axis}(\d+)_lr([\d.e+-]+)', name)
      if m:
        runs[int(m[1])].append((stats.loc[name, 'mean'], float(m[2]), name))
    return runs

  def _best(self, stats: pd.DataFrame) -> dict[int, tuple[float, str]]:
    """size -> (best rate, its rung) over the sizes swept at more than one rate."""
    return {d: min(r)[1:] for d, r in sorted(self._runs(stats).items()) if len(r) > 1}

  def tied(self, stats: pd.DataFrame) -> dict[int, list[float]]:
    """size -> the rates not separated from that size's best (the best included)."""
    runs, best = self._runs(stats), self._best(stats)
    return {d: sorted(rate for _, rate, name in runs[d]
                      if name == rung or (difference(stats, name, rung) is not None
                                          and _order(stats, name, rung) == 0))
            for d, (_, rung) in best.items()}

  def shown(self, stats: pd.DataFrame) -> list[str]:
    best = self._best(stats)
    return [name for _, name in best.values()] if len(best) > 1 else []

  def gap(self, stats: pd.DataFrame) -> str:
    return '; '.join(f'{AXES[self.axis]} {d}: tied with the best at ' + ', '.join(f'{r:g}' for r in rates)
                     for d, rates in self.tied(stats).items())

  def decide(self, stats: pd.DataFrame) -> str:
    grid = sorted({rate for r in self._runs(stats).values() for _, rate, _ in r})
    steps = [[grid.index(rate) for rate in rates] for rates in self.tied(stats).values()]
    moved = max(0, max(min(s) for s in steps) - min(max(s) for s in steps))
    return REPRODUCES if moved == 0 else NOT_AT_SIZE if moved == 1 else CONTRADICTS

  def describe(self) -> str:
    return (f'{self.family}: a rate tied with the best (paired seeds) at every {AXES[self.axis]} '
            '(tied sets one grid step apart: does not at this size; further: contradicts)')


@dataclasses.dataclass(frozen=True)
class Claim:
  """One row: a method's claim in one line, the paper's number and size, and where and how
  it is measured (experiment file name without .py, and a rule over its variants)."""
  method: str
  paper: str
  claim: str
  reported: str
  experiment: str = ''
  rule: Below | NotAbove | Reference | Both | Wider | Transfers | None = None
  metric: str = LOSS  # what the rule compares: the final eval loss, or an analysis scalar


XIONG = 'Xiong et al. 2020, arXiv 2002.04745'
DEEPNET = 'Wang et al. 2022 (DeepNet), arXiv 2203.00555'
MIXLN = 'Li et al. 2024 (Mix-LN), arXiv 2412.13795'
COD = 'Sun et al. 2025 (Curse of Depth), arXiv 2502.05795'
OSP = 'Park et al. 2025 (OSP)'
TLM = 'Bayat, Behrouz & Courville 2026, arXiv 2606.23670'
DYT = 'Zhu et al. 2025, arXiv 2503.10622'
DERF = 'Chen et al. 2025 (Derf), arXiv 2512.10938'
PRORES = 'Chen et al. 2026 (ProRes), arXiv 2603.05369'
LAYERDROP = 'Fan et al. 2019 (LayerDrop)'
LAYERSKIP = 'Elhoushi et al. 2024 (LayerSkip)'
HC = 'Zhu et al. 2024, arXiv 2409.19606'
ATTNRES = 'Kimi 2026, arXiv 2603.15031'
DENSEFORMER = 'Pagliardini et al. 2024 (DenseFormer), arXiv 2402.02622'
HYBRID = 'Zhuo et al. 2025 (HybridNorm), arXiv 2503.04598'
SCALENORM = 'Nguyen & Salazar 2019'
GROMOV = 'Gromov et al. 2024, arXiv 2403.17887'
VALUE_RES = 'Zhou et al. 2024, arXiv 2410.17897; arXiv 2605.03953'
# each family at 4 rates x 4 depths, one seed (repro_depth_transfer: its cpu size; its smoke
# size has one depth and one rate, so nothing is measured there)
TRANSFERS = ('depth_mup_transfer', 'repro_depth_transfer')
SURVEY = 'method_survey'  # experiments/method_survey.py: every method at its own best rate
BEST = ', each at its best rate'
C = Claim
CLAIMS: tuple[Claim, ...] = (
    # the notebooks' papers: placements, warmup, depth
    C('Pre-LN', XIONG, 'without warmup at a large rate Post-LN trains far worse than Pre-LN',
      papers.XIONG_NO_WARMUP, 'repro_pre_vs_post_ln',
      Below('pre_ln', 'post_ln')),
    C('Post-LN', XIONG, 'learning-rate warmup rescues Post-LN',
      papers.XIONG_WARMUP, 'repro_pre_vs_post_ln',
      Below('post_ln_warmup', 'post_ln')),
    C('Post-LN', XIONG, 'learning-rate warmup rescues Post-LN' + BEST,
      papers.XIONG_WARMUP, SURVEY,
      Below('post_ln', 'post_ln_no_warmup')),
    C('Post-LN', DEEPNET, 'trained stably (each at its best rate), Post-LN ends below Pre-LN',
      papers.DEEPNET_POST, SURVEY,
      Below('post_ln', 'pre_ln')),
    C('DeepNorm', DEEPNET, 'DeepNorm trains where Post-LN does not',
      '200 layers, 3.2B params: +5 BLEU over a 48-layer 12B model; trains 1,000 layers',
      'repro_pre_vs_post_ln', Below('deepnorm', 'post_ln')),
    C('DeepNorm', DEEPNET, 'DeepNorm keeps Post-LN\'s performance: below Pre-LN at each one\'s best rate',
      papers.DEEPNET_PRE, SURVEY, Below('deepnorm', 'pre_ln')),
    C('Keel', 'Chen & Wei 2026 (Post-LayerNorm Is Back)', 'Keel improves perplexity over Pre-LN',
      papers.KEEL_REPORTED, 'repro_pre_vs_post_ln', Below('keel', 'pre_ln')),
    C('Keel', 'Chen & Wei 2026 (Post-LayerNorm Is Back)', 'Keel improves perplexity over Pre-LN' + BEST,
      papers.KEEL_REPORTED, SURVEY, Below('keel', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Post-LN', papers.MIXLN_POST,
      'repro_pre_vs_post_ln', Below('mix_ln', 'post_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Pre-LN', papers.MIXLN_PRE,
      'repro_curse_of_depth', Below('mix_ln', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Pre-LN' + BEST, papers.MIXLN_PRE,
      SURVEY, Below('mix_ln', 'pre_ln')),
    C('Mix-LN', MIXLN, 'Mix-LN outperforms Post-LN' + BEST, papers.MIXLN_POST,
      SURVEY, Below('mix_ln', 'post_ln')),
    C('LayerNorm Scaling', COD, 'LayerNorm Scaling lowers the loss of Pre-LN',
      papers.COD_LNS, 'repro_curse_of_depth', Below('lns', 'pre_ln')),
    C('LayerNorm Scaling', COD, 'LayerNorm Scaling lowers the loss of Pre-LN' + BEST,
      papers.COD_LNS, SURVEY, Below('lns', 'pre_ln')),
    C('LayerNorm Scaling', COD, 'deep blocks count more with LNS: a larger effective depth than Pre-LN' + BEST,
      'LLaMA-130M: pruning a deep layer costs more with LNS than with Pre-LN, as curves only '
      '(Figure 4); no number', SURVEY, Below('pre_ln', 'lns'), 'effective_depth/skip'),
    C('DyT', DYT, 'DyT matches or exceeds LayerNorm', papers.DYT_LM, 'repro_norm_free',
      NotAbove('dyt', 'layernorm')),
    C('DyT', DYT, 'DyT matches or exceeds LayerNorm' + BEST, papers.DYT_LM, SURVEY,
      NotAbove('dyt', 'pre_ln')),
    C('Derf', DERF, 'Derf outperforms LayerNorm', papers.DERF_LN, 'repro_norm_free',
      Below('derf', 'layernorm')),
    C('Derf', DERF, 'Derf outperforms DyT', papers.DERF_DYT, 'repro_norm_free', Below('derf', 'dyt')),
    C('Derf', DERF, 'Derf outperforms LayerNorm' + BEST, papers.DERF_LN, SURVEY, Below('derf', 'pre_ln')),
    C('Derf', DERF, 'Derf outperforms DyT' + BEST, papers.DERF_DYT, SURVEY, Below('derf', 'dyt')),
    C('DyT', 'DyT is regime-dependent (2026)', 'DyT helps at small token budgets, hurts at large',
      'GPT-2 64M: -27.3% val loss at 1M tokens, +18.8% at 118M', 'dyt_budget',
      Both(Below('dyt_small', 'ln_small'), Below('ln_large', 'dyt_large'))),
    C('ProRes', PRORES, 'progressive residual warmup lowers the final loss', papers.PRORES_REPORTED,
      'repro_training_dynamics', Below('prores', 'pre_ln')),
    C('ProRes', PRORES, 'progressive residual warmup lowers the final loss' + BEST, papers.PRORES_REPORTED,
      SURVEY, Below('prores', 'pre_ln')),
    C('LayerDrop', LAYERDROP, 'LayerDrop regularizes: lower final loss', papers.LAYERDROP_REPORTED,
      'repro_training_dynamics', Below('layerdrop', 'pre_ln')),
    C('LayerDrop', LAYERDROP, 'LayerDrop regularizes: lower final loss' + BEST, papers.LAYERDROP_REPORTED,
      SURVEY, Below('layerdrop', 'pre_ln')),
    C('LayerSkip', LAYERSKIP, 'layer dropout plus early-exit loss makes early exits accurate',
      'Llama models; self-speculative decoding up to 2.16x faster', SURVEY,
      Reference('layerskip', 'pre_ln')),
    C('Hyper-connections (static / dynamic)', HC,
      'hyper-connections beat the standard residual at equal size',
      'OLMo-7B, 500B tokens: V2 eval loss DHCx4 2.559 vs residual 2.581, gap -0.022 (Table 5)',
      'repro_width_depth_ladder', Below('hyper_connections_d64_L8', 'pre_ln_d64_L8')),
    C('Hyper-connections (static / dynamic)', HC,
      'dynamic hyper-connections beat the standard residual' + BEST,
      'OLMo-1B, 500B tokens: V2 eval loss DHCx4 2.781 vs residual 2.811, gap -0.030 (static '
      'SHCx4 2.791) (Table 2)', SURVEY,
      Below('hyper_connections', 'pre_ln')),
    C('AttnRes / Block AttnRes', ATTNRES, 'attention over earlier layers beats the fixed residual sum',
      papers.ATTNRES_REPORTED, 'repro_width_depth_ladder', Below('attn_res_d64_L8', 'pre_ln_d64_L8')),
    C('AttnRes / Block AttnRes', ATTNRES, 'attention over earlier layers beats the fixed residual sum' + BEST,
      papers.ATTNRES_REPORTED, SURVEY, Below('attn_res', 'pre_ln')),
    C('DenseFormer (DWA)', DENSEFORMER, 'depth-weighted averages of past block outputs lower the loss',
      papers.DENSEFORMER_REPORTED, 'repro_width_depth_ladder', Below('denseformer_d64_L8', 'pre_ln_d64_L8')),
    C('DenseFormer (DWA)', DENSEFORMER,
      'depth-weighted averages of past block outputs lower the loss' + BEST, papers.DENSEFORMER_REPORTED, SURVEY,
      Below('denseformer', 'pre_ln')),
    *(C('depth-muP', 'Yang et al. 2023 (Tensor Programs VI)', 'the optimal learning rate transfers across depth',
        papers.TP6_REPORTED, e, Transfers('depth_mup')) for e in TRANSFERS),
    *(C('depth-muP', 'Bordelon et al. 2023 (depthwise hyperparameter transfer)',
        '1/sqrt(L) branch scaling makes the optimal rate transfer across depth', papers.BORDELON_REPORTED,
        e, Transfers('depth_mup')) for e in TRANSFERS),
    C('Pre-LN', 'Wang et al. 2026 (DepthBench), arXiv 2609.32534',
      'at a fixed size, deep-narrow Pre-LN gains little or loses against wide-shallow',
      papers.DEPTHBENCH_REPORTED, 'repro_width_depth_ladder',
      NotAbove('pre_ln_d128_L2', 'pre_ln_d32_L32')),
    C('Pre-LN', 'Wang et al. 2026 (DepthBench), arXiv 2609.32534',
      'at a fixed size, deep-narrow Pre-LN gains little or loses against wide-shallow' + BEST,
      papers.DEPTHBENCH_REPORTED, SURVEY, NotAbove('wide_shallow', 'pre_ln')),
    *(C('CompleteP', 'Dey et al. 2025 (CompleteP)', 'alpha = 1 transfers hyperparameters across depth and trains deep models compute-efficiently',
        papers.COMPLETEP_REPORTED, e, Transfers('completep')) for e in TRANSFERS),
    # every other method of docs/methods.md, measured by the survey
    C('Peri-LN', 'Kim et al. 2025 (Peri-LN)', 'Peri-LN balances variance growth and trains better than Pre-LN',
      papers.PERILN_REPORTED, SURVEY, Below('peri_ln', 'pre_ln')),
    C('Sandwich-LN', 'Ding et al. 2021 (CogView)', 'sandwich norms stabilize training', NO_NUMBER,
      SURVEY, NotAbove('sandwich_ln', 'pre_ln')),
    C('Sub-LN (Magneto)', 'Wang et al. 2022 (Foundation Transformers)', 'Sub-LN performs better than the usual placements',
      papers.SUBLN_REPORTED, SURVEY, Below('sub_ln', 'pre_ln')),
    C('NormFormer', 'Shleifer et al. 2021 (NormFormer)', 'extra norms improve Pre-LN pre-training perplexity',
      '1.3B: equal perplexity 24% faster, 0.27 lower perplexity at equal compute',
      SURVEY, Below('normformer', 'pre_ln')),
    C('HybridNorm', HYBRID, 'HybridNorm outperforms Pre-Norm and Post-Norm',
      '550M dense, 400B tokens: train loss HybridNorm 2.74 vs Pre-Norm 2.75 (Post-Norm 2.76), gap '
      '-0.01; C4 ppl 20.00 vs 20.30, -1.5% ppl, loss gap -0.015 (Table 6)', SURVEY,
      Below('hybridnorm', 'pre_ln')),
    C('HybridNorm*', HYBRID, 'HybridNorm* outperforms Pre-Norm',
      '7B dense, 150B tokens: train loss HybridNorm* 2.430 vs Pre-Norm 2.469, gap -0.039; C4 ppl '
      '14.83 vs 15.32 (Table 3)', SURVEY,
      Below('hybridnorm_star', 'pre_ln')),
    C('BranchNorm (reconstruction from the abstract)', 'Liu et al. 2023 (BranchNorm)',
      'better stability/convergence trade-off than DeepNorm', 'translation; ' + NO_NUMBER,
      SURVEY, Below('branchnorm', 'deepnorm')),
    C('nGPT', 'Loshchilov et al. 2024 (nGPT)', 'nGPT reaches the same accuracy in fewer steps (so: lower loss at equal steps)',
      '4x to 20x fewer steps, depending on sequence length', SURVEY, Below('ngpt', 'pre_ln')),
    C('SimpleNorm', 'Chen et al. 2026 (SimpleGPT)', 'SimpleNorm tolerates larger rates and ends lower',
      '7B, 60K steps: train loss 2.208 vs 2.290 (LLaMA2 with QK-norm); rates 3x-10x larger',
      SURVEY, Below('simple_norm', 'pre_ln')),
    C('GPAS', 'Chen et al. 2025 (GPAS)', 'GPAS improves Pre-LN', '71M to 1B params; ' + NO_NUMBER,
      SURVEY, Below('gpas', 'pre_ln')),
    C('QK-norm', 'Henry et al. 2020 (QKNorm); OLMo 2', 'normalized queries and keys avoid softmax saturation',
      'low-resource translation: +0.928 BLEU on average', SURVEY, Reference('qk_norm', 'pre_ln')),
    C('LayerRoPE (interpretation)', 'LayerRoPE 2026', 'LayerRoPE beats Pre-, Post-, Peri-LN and LNS',
      "Pre-Norm's 1.3B loss with 3.4x less compute; up to 512 layers", SURVEY,
      Below('layer_rope', 'pre_ln')),
    C('LayerNorm', 'Ba et al. 2016', 'normalization stabilizes and speeds up training', papers.LAYERNORM_REPORTED,
      SURVEY, Below('pre_ln', 'no_norm')),
    C('RMSNorm', 'Zhang & Sennrich 2019, arXiv 1910.07467', 'RMSNorm performs comparably to LayerNorm',
      'comparable quality, 7% to 64% faster', SURVEY, NotAbove('rmsnorm', 'pre_ln')),
    C('CRMSNorm (Pre-CRMSNorm)', 'Jiang et al. 2023, arXiv 2305.14858',
      'Pre-LN, Pre-RMSNorm and Pre-CRMSNorm are equivalent', '1% to 10% faster; exact equivalence',
      SURVEY, NotAbove('crmsnorm', 'pre_ln')),
    C('ScaleNorm', SCALENORM, 'ScaleNorm trains faster and better',
      'five low-resource pairs: +1.1 BLEU on average (with PreNorm and FixNorm)', SURVEY,
      Below('scalenorm', 'pre_ln')),
    C('FixNorm', SCALENORM, 'fixed-length word embeddings help', 'see ScaleNorm', SURVEY,
      Below('fixnorm', 'scalenorm')),
    C('BHyT (star)', 'Byun et al. 2026 (BHyT)', 'BHyT matches RMSNorm and trains faster',
      '15.8% faster training, 4.2% higher generation throughput than RMSNorm', SURVEY,
      NotAbove('bhyt', 'rmsnorm')),
    C('SeeDNorm', 'Cai et al. 2025 (SeeDNorm)', 'SeeDNorm outperforms RMSNorm, LayerNorm and DyT', NO_NUMBER,
      SURVEY, Below('seednorm', 'rmsnorm')),
    C('none', '(norm-free studies)', 'reference: no normalization', 'not a claim', SURVEY,
      Reference('no_norm', 'pre_ln')),
    C('GELU (tanh form)', 'Hendrycks & Gimpel 2016', 'reference activation', 'not a claim', SURVEY,
      Reference('pre_ln', 'relu2')),
    C('ReLU', 'Jha & Reagen 2024, arXiv 2410.09637', 'without LayerNorm, ReLU beats GELU',
      '8.2% perplexity improvement', SURVEY, Below('no_norm_relu', 'no_norm')),
    C('squared ReLU', 'So et al. 2021 (Primer), arXiv 2109.08668', 'squared ReLU improves language modelling',
      papers.PRIMER_REPORTED, SURVEY, Below('relu2', 'pre_ln')),
    C('SwiGLU', 'Shazeer 2020, arXiv 2002.05202', 'gated MLPs improve perplexity',
      'T5-base (12+12 layers, d 768), C4, 524,288 steps: held-out log-perplexity SwiGLU 1.636 vs '
      'GELU 1.679, gap -0.043 (Table 1)', SURVEY,
      Below('swiglu', 'pre_ln')),
    C('tapered MLP width (reconstruction)', TLM, 'earlier-heavy MLP widths beat uniform widths at a fixed budget',
      NO_NUMBER, SURVEY, Below('taper_cosine', 'pre_ln')),
    C('tapered MLP width (reconstruction)', TLM, 'the reverse allocation hurts', NO_NUMBER,
      SURVEY, Below('pre_ln', 'taper_reverse')),
    C('muP (Adam)', 'Yang et al. 2022 (Tensor Programs V)', 'the optimal learning rate transfers across width',
      papers.MUP_REPORTED, 'mup_width_transfer', Transfers('mup', axis='d')),
    C('init: normal / xavier / small_init / depth_scaled', 'GPT-2; Glorot & Bengio 2010; Nguyen & Salazar 2019',
      'reference inits: small_init against normal', 'not a claim', SURVEY,
      Reference('small_init', 'pre_ln')),
    C('init: deepnorm', DEEPNET, 'see DeepNorm: with its init, DeepNorm trains where Post-LN does not',
      'see DeepNorm', SURVEY, Below('deepnorm', 'post_ln')),
    C('DeepScaleLM', 'Kedia et al. 2024 (DeepScaleLM)', 'deeper models with fewer parameters beat shallow ones',
      papers.DEEPSCALELM_REPORTED, SURVEY, Reference('deepscalelm', 'pre_ln')),
    C('Q/K slow-down', 'arXiv 2605.10504', 'slowing upper-layer Q/K early improves final perplexity', papers.QKSLOW_REPORTED,
      SURVEY, Below('qk_slow', 'pre_ln')),
    C('LLR', 'arXiv 2605.22297', 'layer-wise rates from heavy-tailedness converge faster',
      papers.LLR_REPORTED, SURVEY, Below('llr', 'pre_ln')),
    C('AdamW', 'Loshchilov & Hutter 2019', 'reference optimizer', 'not a claim', SURVEY,
      Reference('pre_ln', 'muon')),
    C('Muon', 'Jordan et al. 2024; Park et al. 2025 (OSP)', 'Muon trains without outlier channels',
      '1.4B, 1T tokens: excess kurtosis 0.04 vs 1818.56 (with the two OSP parts below)', SURVEY,
      Reference('muon', 'pre_ln')),
    C('single-scale RMSNorm', OSP, 'one scale prevents channel-wise amplification', 'see Muon', SURVEY,
      Reference('osp', 'muon')),
    C('embedding projection', OSP, 'a learned projection spreads embedding outliers', 'see Muon', SURVEY,
      Reference('osp', 'muon')),
    C('standard residual', 'He et al. 2016', 'reference residual', 'not a claim', SURVEY,
      Reference('pre_ln', 'no_norm')),
    C('mHC', 'Xie et al. 2025, arXiv 2512.24880', 'manifold-constrained hyper-connections train stably and better',
      papers.MHC_REPORTED, SURVEY, Below('mhc', 'pre_ln')),
    C('LAuReL RW / LR / PA / RW+LR', 'Menghani et al. 2025, arXiv 2411.07501',
      'a learned residual beats the standard one at almost no cost',
      'ResNet-50 ImageNet: 60% of the gain of an extra layer for 0.003% more params', SURVEY,
      Below('laurel', 'pre_ln')),
    C('ResFormer / SVFormer / SATFormer', VALUE_RES, 'value residuals lower the loss (ResFormer)',
      '20B-token SlimPajama subset: ResFormer reaches the Transformer\'s val loss with 10.4% fewer '
      'params or 13.6% less data; loss gaps as curves only (arXiv 2410.17897 v2, Section 1)', SURVEY,
      Below('resformer', 'pre_ln')),
    C('Parallel block', 'GPT-J, PaLM; GPT-NeoX', 'parallel attention and MLP match the serial block (GPT-J)',
      papers.PARALLEL_REPORTED, SURVEY, NotAbove('parallel_gptj', 'pre_ln')),
    C('MoDA', 'MoDA (hustvl), arXiv 2603.15619', 'attending to earlier layers lowers the loss', papers.MODA_REPORTED,
      SURVEY, Below('moda', 'pre_ln')),
    # procedures on trained models (experiments/posthoc.py, one seed: rows show the numbers)
    C('Layer pruning with healing', GROMOV, 'deep layers can be pruned with little loss after healing (2 of 8)',
      papers.GROMOV_REPORTED, 'posthoc', Reference('prune_n2', 'prune_n0')),
    C('Layer pruning with healing', GROMOV, 'deep layers can be pruned with little loss after healing (4 of 8)',
      papers.GROMOV_REPORTED, 'posthoc', Reference('prune_n4', 'prune_n0')),
    C('Removing the norms by fine-tuning', 'Heimersheim 2024, arXiv 2409.13710',
      'LayerNorm can be removed from GPT-2 by fine-tuning', 'GPT-2 small: +0.05 cross-entropy after 500M tokens',
      'posthoc', Reference('ln_free', 'L8')),
    C('Linear maps across depth', 'Csordás et al. 2025, arXiv 2505.13898',
      'second-half layers contribute little (so: half the depth loses little)', papers.CSORDAS_REPORTED, 'posthoc',
      Reference('L4', 'L8')),
    C('Recurrence (layer tying, Universal-Transformer depth)', 'Dehghani et al. 2018, arXiv 1807.03819',
      'a looped block matches a deeper unique stack', papers.UT_REPORTED, SURVEY, NotAbove('loop', 'pre_ln')),
    C('Relaxed Recursive Transformer', 'Bae et al. 2024, arXiv 2410.20672',
      'per-loop LoRA improves a looped model', papers.RELAXED_REPORTED, SURVEY,
      Below('relaxed_loop', 'loop')),
    # rate sensitivity, from the survey's stage-1 sweeps (CompleteP's: the transfer rows)
    C('DeepNorm', DEEPNET, 'DeepNorm trains well over a wider range of learning rates than Post-LN',
      'see the DeepNorm rows', SURVEY, Wider('deepnorm', 'post_ln')),
    C('Keel', 'Chen & Wei 2026 (Post-LayerNorm Is Back)',
      'Keel trains well over a wider range of learning rates than Pre-LN', 'see the Keel rows',
      SURVEY, Wider('keel', 'pre_ln')),
    C('nGPT', 'Loshchilov et al. 2024 (nGPT)', 'nGPT is less sensitive to the learning rate than Pre-LN',
      'see the nGPT row', SURVEY, Wider('ngpt', 'pre_ln')),
    C('SimpleNorm', 'Chen et al. 2026 (SimpleGPT)', 'SimpleNorm trains well over a wider range of rates',
      'rates 3x-10x larger than LLaMA2 with QK-norm (abstract)', SURVEY, Wider('simple_norm', 'pre_ln')),
)


def final_values(res: Results, metric: str = LOSS) -> pd.Series:
  """Per finished rung: its final eval loss, or the last logged value of an analysis scalar
  ('effective_depth/skip'); rungs that never logged it are left out."""
  if metric == LOSS:
    return res.summaries.set_index('rung')[LOSS]
  s = res.scalars[(res.scalars.tag == metric) & res.scalars.rung.isin(res.summaries.rung)]
  return s.loc[s.groupby('rung').step.idxmax()].set_index('rung').value


def variant_stats(res: Results, metric: str = LOSS) -> pd.DataFrame:
  """Per variant (index): seeds, mean, low, high (of final_values, 95% Student-t), by_seed
  (train.seed -> value), lr (of a sweep's finalists, the one with the lowest mean loss:
  intervals.finalist), edge (of a swept variant whose best rate is the lowest or highest it
  measured, extensions past its grid included: intervals.edge), L, D, params
  (non-embedding), tokens, data."""
  cfg = res.configs.set_index('rung')
  swept = {intervals.variant(c.rung): c.losses for c in res.choices.itertuples()}
  values, loss = final_values(res, metric), final_values(res)
  done = res.summaries[res.summaries.rung.isin(values.index)]
  rows = []
  for v, g in done.groupby(done.rung.map(intervals.variant), sort=False):
    rungs = intervals.finalist(loss[g.rung], cfg['optim.lr'])
    mean, low, high = intervals.t_interval(values[rungs])
    c, lr = cfg.loc[rungs[0]], cfg.loc[rungs[0], 'optim.lr']
    first = g.set_index('rung').loc[rungs[0]]
    rows.append({'variant': v, 'seeds': len(rungs), 'mean': mean, 'low': low, 'high': high,
                 'by_seed': {int(cfg.loc[r, 'train.seed']): float(values[r]) for r in rungs},
                 'lr': lr, 'edge': intervals.edge(lr, swept[v], res.configs) if v in swept else '',
                 'L': int(c['model.num_layers']), 'D': int(c['model.d_model']),
                 'params': int(first.non_embedding_params), 'tokens': int(first.tokens),
                 'data': c['data.source']})
  return pd.DataFrame(rows).set_index('variant') if rows else pd.DataFrame()


def verdict(claim: Claim, stats: pd.DataFrame | None) -> str:
  """The claim's verdict from one ladder's variant_stats (None: not run)."""
  shown = claim.rule.shown(stats) if claim.rule is not None and stats is not None else []
  if not shown or not set(shown) <= set(stats.index):
    return NOT_MEASURED
  return claim.rule.decide(stats)


def evaluate(runs: dict[tuple[str, str], Results],
             table: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
  """One row per (claim, run of its experiment), or one 'not measured' row per claim with
  none: method, paper, claim, reported, measured_by (experiment:size), rule, size, data,
  tokens (each budget of the variants shown), measured (mean [interval] per variant),
  verdict. runs: (experiment, size) -> its loaded ladder."""
  rows, cache = [], {}  # (run, metric) -> its variant_stats, computed once
  for c in table:
    rule = c.rule.describe() if c.rule else 'no experiment measures it yet'
    base = {'method': c.method, 'paper': c.paper, 'claim': c.claim, 'reported': c.reported,
            'rule': rule if c.metric == LOSS else f'{c.metric}: {rule}'}
    for key in [k for k in runs if k[0] == c.experiment and (k, c.metric) not in cache]:
      cache[key, c.metric] = variant_stats(runs[key], c.metric)
    found = [(size, cache[(exp, size), c.metric]) for exp, size in runs if exp == c.experiment]
    for size, s in found or [('', None)]:
      v = verdict(c, s)
      row = {**base, 'measured_by': f'{c.experiment}:{size}' if size else c.experiment or '-',
             'size': '-', 'data': '-', 'tokens': '-', 'measured': '-', 'gap': '-', 'verdict': v}
      if v != NOT_MEASURED:
        shown = c.rule.shown(s)
        a = s.loc[shown[0]]
        budgets = s.loc[shown].drop_duplicates('tokens').itertuples()
        row.update(size=f'L{a.L} d{a.D}, {a.params:,} non-emb params', data=a.data,
                   tokens='; '.join(f'{b.tokens:,} ({b.tokens / b.params:.2g}/param)' for b in budgets),
                   measured='; '.join(_measured(n, s.loc[n]) for n in shown),
                   gap=c.rule.gap(s))
      rows.append(row)
  return pd.DataFrame(rows)


def _measured(name: str, s: pd.Series) -> str:
  interval = f' [{s.low:.3f}, {s.high:.3f}]' if s.seeds > 1 else ''
  edge = f", the grid's {s.edge}" if s.edge else ''
  return f'{name} {s["mean"]:.3f}{interval} ({s.seeds} seed{"s" if s.seeds > 1 else ""}, lr {s.lr:g}{edge})'


COLUMNS = ('method', 'paper', 'claim', 'reported', 'measured_by', 'size', 'data', 'tokens',
           'measured', 'gap', 'verdict', 'rule')


def markdown(table: pd.DataFrame, note: str = '') -> str:
  """docs/claims.md: how it is made, the runs it read (and `note`: machine, load), then
  the table."""
  head = ['# Claims and verdicts', '',
          'Generated by `python -m depthscale.claims` from the runs kept in records/ (each rung\'s',
          'config, summary and logs): do not edit by hand; the same command regenerates it.',
          'Each row: a claim of a paper, what the paper reports (from its full text where a table,',
          'figure or section is cited, from its abstract otherwise; a loss gap is the natural-log',
          'cross-entropy difference, from the perplexities where the paper gives those), the run',
          'that measures it here (experiment file and size), the measured final eval loss per',
          'variant as mean and 95% Student-t interval over its seeds, the gap a - b of the two',
          'variants the rule compares (mean and 95% t-interval of the per-seed differences: seed k',
          'sees the same batches in every variant, so the seeds pair; "unpaired" where fewer than',
          '2 seeds pair), and the verdict that the row\'s rule gives from that gap. Verdicts:',
          'reproduces; does not at this size (the gap\'s interval contains 0: nothing separates at',
          'this size and seed count); contradicts; measured, no verdict (a reference method, a',
          'claim about something other than the final loss, or a one-seed run); not measured (no',
          'run kept, or its ladder lacks the variants). A rule on an analysis scalar names it',
          '(effective_depth/skip, docs/metrics.md). A swept variant trains its seeds at its two',
          'best stage-1 rates and counts the one with the lower mean. "The grid\'s highest" (or',
          'lowest) after a rate: that variant\'s best rate is the edge of its learning-rate sweep,',
          'so its optimum may lie beyond the rates tried. The claims, papers\' numbers and rules',
          'live in `depthscale/results/claims.py`.', '',
          'Runs read: ' + (', '.join(sorted({m for m in table.measured_by if ':' in m})) or 'none')
          + (f'. {note.rstrip(".")}' if note else '') + '.', '']
  lines = ['| ' + ' | '.join(COLUMNS) + ' |', '|' + '---|' * len(COLUMNS)]
  for _, r in table.iterrows():
    lines.append('| ' + ' | '.join(str(r[c]).replace('|', '/') for c in COLUMNS) + ' |')
  return '\n'.join(head + lines) + '\n'
