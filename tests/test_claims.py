"""The claims table (depthscale.results.claims): verdict rules on ladder directories with
known outcomes, the command that writes docs/claims.md, and a row for every method."""

import json
import os
import re

import numpy as np
import pytest
from scipy import stats

from depthscale import claims as claims_cli
from depthscale import experiment
from depthscale.results import claims, intervals, loader
from tests.helpers import ROOT

RULES = (claims.Claim('m', 'p', 'a beats b', 'n/a', 'exp', claims.Below('a', 'b')),
         claims.Claim('m', 'p', 'a matches b', 'n/a', 'exp', claims.NotAbove('a', 'b')),
         claims.Claim('m', 'p', 'a beats c', 'n/a', 'exp', claims.Below('a', 'c')),
         claims.Claim('m', 'p', 'never run', 'n/a', 'other', claims.Below('a', 'b')),
         claims.Claim('m', 'p', 'no experiment', 'n/a'),
         claims.Claim('m', 'p', 'a beside b', 'n/a', 'exp', claims.Reference('a', 'b')))


def ladder(path, losses: dict[str, list[float]], name=lambda v, k: f'{v}_s{k}', tokens=lambda v: 12000):
  """A ladder directory of finished rungs name(variant, k) ('<variant>_s<k>') with the given
  final eval losses, trained on tokens(variant) tokens."""
  for v, values in losses.items():
    for k, loss in enumerate(values):
      d = path / name(v, k)
      os.makedirs(d)
      (d / 'config.json').write_text(json.dumps({
          'model': {'num_layers': 2, 'd_model': 16}, 'data': {'seq_len': 16, 'source': 'grammar'},
          'optim': {'lr': 1e-3}, 'train': {'seed': k}}))
      (d / 'summary.json').write_text(json.dumps({
          'final_eval_loss': loss, 'non_embedding_params': 6000, 'tokens': tokens(v)}))
  return loader.load(str(path))


@pytest.mark.parametrize('a, b, below, not_above', [
    ([2.0, 2.01, 2.02], [2.5, 2.51, 2.52], claims.REPRODUCES, claims.REPRODUCES),
    ([2.5, 2.51, 2.52], [2.0, 2.01, 2.02], claims.CONTRADICTS, claims.CONTRADICTS),
    ([2.0, 2.3, 2.6], [2.2, 2.3, 2.4], claims.NOT_AT_SIZE, claims.REPRODUCES),
    ([2.0], [2.5], claims.NOT_AT_SIZE, claims.REPRODUCES),  # one seed: no interval
])
def test_verdicts_from_runs(tmp_path, a, b, below, not_above):
  res = ladder(tmp_path, {'a': a, 'b': b})
  table = claims.evaluate({('exp', 'tiny'): res}, RULES)
  assert list(table.verdict) == [below, not_above, claims.NOT_MEASURED, claims.NOT_MEASURED,
                                 claims.NOT_MEASURED, claims.MEASURED]
  assert list(table.measured_by) == ['exp:tiny'] * 3 + ['other', '-', 'exp:tiny']
  assert table.measured[5] == table.measured[0]  # a reference row shows the same numbers
  if len(a) > 1:
    assert table.measured[0].startswith(f'a {sum(a) / 3:.3f} [') and '3 seeds, lr 0.001' in table.measured[0]
  assert table['size'][0] == 'L2 d16, 6,000 non-emb params' and table.tokens[0] == '12,000 (2/param)'


def test_a_best_rate_at_the_edge_of_its_sweep_is_said(tmp_path):
  res = ladder(tmp_path, {'a': [2.0, 2.01, 2.02], 'b': [2.5, 2.51, 2.52]},
               name=lambda v, k: f'{v}_best_s{k + 1}')
  grids = {'a': ('3e-4', '1e-3', '3e-3'), 'b': ('1e-3', '3e-3', '1e-2')}  # best 1e-3: inside, lowest
  for v, rates in grids.items():
    losses = {f'{v}_lr{r}': 2.7 if r == '1e-3' else 2.8 for r in rates}
    for name, r in zip(losses, rates):  # the stage-1 rungs' configs give the rates
      os.makedirs(tmp_path / name)
      (tmp_path / name / 'config.json').write_text(json.dumps({'optim': {'lr': float(r)}}))
    for k in (1, 2, 3):
      (tmp_path / f'{v}_best_s{k}' / 'best_lr.json').write_text(json.dumps(
          {'lr': 1e-3, 'from': f'{v}_lr1e-3', 'losses': losses}))
  measured = claims.evaluate({('exp', 'tiny'): loader.load(str(tmp_path))}, RULES).measured[0]
  a, b = measured.split('; ')
  assert a.endswith('(3 seeds, lr 0.001)') and b.endswith("(3 seeds, lr 0.001, the grid's lowest)")


def test_a_rule_on_an_analysis_scalar_reads_its_last_value(tmp_path):
  res = ladder(tmp_path, {'a': [2.0, 2.0, 2.0], 'b': [2.0, 2.0, 2.0]})
  for v, depths in {'a': [2, 2, 3], 'b': [6, 7, 6]}.items():
    for k, depth in enumerate(depths):  # step 0 says the opposite: only the last step counts
      with open(tmp_path / f'{v}_s{k}' / 'analysis_log.jsonl', 'w') as f:
        f.write(json.dumps({'step': 0, 'effective_depth/skip': 9 - depth}) + '\n')
        f.write(json.dumps({'step': 9, 'effective_depth/skip': depth}) + '\n')
  rule = claims.Claim('m', 'p', 'b is deeper', 'n/a', 'exp', claims.Below('a', 'b'), 'effective_depth/skip')
  row = claims.evaluate({('exp', 'tiny'): loader.load(str(tmp_path))}, (rule,)).iloc[0]
  assert row.verdict == claims.REPRODUCES and row.measured.startswith('a 2.333 [')
  assert row.rule.startswith('effective_depth/skip: a below b')
  loss = claims.evaluate({('exp', 'tiny'): loader.load(str(tmp_path))}, (RULES[0],)).iloc[0]
  assert loss.verdict == claims.NOT_AT_SIZE  # equal losses


def test_a_paired_verdict_cancels_the_noise_seeds_share(tmp_path):
  shared = [2.0, 2.6, 3.2]  # seed k's data order moves both variants alike
  a, b = [x - 0.05 for x in shared], [shared[0], shared[1] + 0.01, shared[2] - 0.01]
  assert intervals.order(intervals.t_interval(a)[1:], intervals.t_interval(b)[1:]) == 0  # unpaired: tied
  row = claims.evaluate({('exp', 'tiny'): ladder(tmp_path, {'a': a, 'b': b})}, RULES[:1]).iloc[0]
  assert row.verdict == claims.REPRODUCES and row.gap.startswith('a - b -0.050 [') and '(3 paired seeds)' in row.gap
  assert row.measured.startswith('a 2.550 [')  # the unpaired mean and interval stay


def test_variants_without_common_seeds_fall_back_to_unpaired_intervals(tmp_path):
  ladder(tmp_path, {'a': [2.0, 2.01, 2.02]})
  res = ladder(tmp_path, {'b': [9.0, 9.0, 2.5, 2.51, 2.52]})  # b's seeds 3, 4 only would pair...
  res.configs.loc[res.configs.rung.str.startswith('b'), 'train.seed'] += 3  # ...now none do
  row = claims.evaluate({('exp', 'tiny'): res}, RULES[:1]).iloc[0]
  assert row.gap.endswith('(unpaired)') and row.verdict == claims.NOT_AT_SIZE  # b's interval is wide


def test_paired_interval_is_scipys_ttest_rel_interval():
  rng = np.random.default_rng(1)
  a, b = rng.normal(2.5, 0.3, 5), rng.normal(2.6, 0.3, 5)
  mean, low, high = intervals.paired_interval(a, b)
  ci = stats.ttest_rel(a, b).confidence_interval(0.95)
  assert mean == pytest.approx(np.mean(a - b), rel=1e-12)
  assert (low, high) == (pytest.approx(ci.low, rel=1e-12), pytest.approx(ci.high, rel=1e-12))


@pytest.mark.parametrize('config, rungs', [
    ('method_survey.py:smoke', ('pre_ln_best_s1', 'post_ln_best_s1', 'lns_best_s1')),
    ('repro_width_depth_ladder.py:smoke', None),  # shapes differ: the data order still pairs
])
def test_seed_k_sees_the_same_batches_in_every_variant(config, rungs):
  from depthscale.data import pipeline
  resolved = experiment.resolve(os.path.join(ROOT, 'experiments', config), check_machine=False)
  by_seed = {}
  for r, cfg in resolved:
    if rungs is None or r.name in rungs:
      it = pipeline.train_iterator(cfg.data, cfg.train.seed)
      by_seed.setdefault(cfg.train.seed, []).append((r.name, [next(it)['inputs'] for _ in range(3)]))
  assert sum(len(v) > 1 for v in by_seed.values()) >= 1, by_seed.keys()
  for seed, runs in by_seed.items():
    for name, batches in runs[1:]:
      assert all(np.array_equal(x, y) for x, y in zip(batches, runs[0][1])), (seed, name, runs[0][0])
  firsts = [runs[0][1][0] for runs in by_seed.values()]
  assert all(not np.array_equal(firsts[0], f) for f in firsts[1:])  # another seed, other batches


LOW, HIGH, WIDE = [2.0, 2.01, 2.02], [2.5, 2.51, 2.52], [1.5, 2.25, 3.0]


@pytest.mark.parametrize('dyt_small, ln_small, ln_large, dyt_large, verdict', [
    (LOW, HIGH, LOW, HIGH, claims.REPRODUCES),  # helps at the small budget, hurts at the large
    (HIGH, LOW, LOW, HIGH, claims.CONTRADICTS),  # hurts at the small budget
    (LOW, HIGH, HIGH, LOW, claims.CONTRADICTS),  # helps at the large budget
    (LOW, HIGH, WIDE, HIGH, claims.NOT_AT_SIZE),  # only the small budget separates
    (LOW, WIDE, LOW, HIGH, claims.NOT_AT_SIZE),  # only the large budget separates
    (HIGH, WIDE, LOW, HIGH, claims.NOT_AT_SIZE),  # the other way only where nothing separates
])
def test_the_dyt_budget_row_needs_both_regimes(tmp_path, dyt_small, ln_small, ln_large, dyt_large, verdict):
  losses = {'dyt_small': dyt_small, 'ln_small': ln_small, 'ln_large': ln_large, 'dyt_large': dyt_large}
  res = ladder(tmp_path, losses, lambda v, k: f'{v}_best_s{k + 1}',  # lr_sweep's stage-2 names
               lambda v: 600 if v.endswith('_small') else 12000)
  row = claims.evaluate({('dyt_budget', 'cpu'): res}).set_index('measured_by').loc['dyt_budget:cpu']
  assert row.verdict == verdict
  assert [m.split()[0] for m in row.measured.split('; ')] == list(losses)
  assert row.tokens == '600 (0.1/param); 12,000 (2/param)'
  assert row.rule == ('dyt_small below ln_small and ln_large below dyt_large, separated '
                      '(either the other way: contradicts; one not separated: does not at this size)')


@pytest.mark.parametrize('best_at_l8, verdict', [
    (0.01, claims.REPRODUCES), (0.1, claims.NOT_AT_SIZE), (0.3, claims.CONTRADICTS), (None, claims.NOT_MEASURED)])
def test_transfer_rule_compares_the_best_rate_across_depth(tmp_path, best_at_l8, verdict):
  rates = (0.001, 0.01, 0.1, 0.3)
  losses = {f'fam_L2_lr{r:g}': [3.0 - (r == 0.01)] for r in rates}  # best at 0.01
  if best_at_l8:
    losses.update({f'fam_L8_lr{r:g}': [3.0 - (r == best_at_l8)] for r in rates})
  losses['other_L8_lr0.001'] = [1.0]  # another family's rungs do not count
  rule = claims.Claim('m', 'p', 'transfers', 'n/a', 'exp', claims.Transfers('fam'))
  row = claims.evaluate({('exp', 'tiny'): ladder(tmp_path, losses)}, (rule,)).iloc[0]
  assert row.verdict == verdict
  if best_at_l8:
    assert row.measured == f'fam_L2_lr0.01 2.000 (1 seed, lr 0.001); fam_L8_lr{best_at_l8:g} 2.000 (1 seed, lr 0.001)'


@pytest.mark.parametrize('best_at_d256, verdict', [
    (0.01, claims.REPRODUCES), (0.03, claims.NOT_AT_SIZE), (0.1, claims.CONTRADICTS)])
def test_width_transfer_rule_compares_the_best_rate_across_width(tmp_path, best_at_d256, verdict):
  rates = (0.001, 0.003, 0.01, 0.03, 0.1)
  losses = {f'fam_d{d}_lr{r:g}': [3.0 - (r == 0.01)] for d in (32, 64) for r in rates}
  losses.update({f'fam_d256_lr{r:g}': [3.0 - (r == best_at_d256)] for r in rates})
  # depth rungs, lower losses, best rate four steps apart: the width rule ignores them
  losses.update({f'fam_L{l}_lr{r:g}': [2.0 - (r == (0.001 if l == 2 else 0.1))] for l in (2, 8) for r in rates})
  rule = claims.Claim('m', 'p', 'transfers', 'n/a', 'exp', claims.Transfers('fam', axis='d'))
  row = claims.evaluate({('exp', 'tiny'): ladder(tmp_path, losses)}, (rule,)).iloc[0]
  assert row.verdict == verdict
  assert [m.split()[0] for m in row.measured.split('; ')] == [
      'fam_d32_lr0.01', 'fam_d64_lr0.01', f'fam_d256_lr{best_at_d256:g}']
  assert row.rule.startswith('fam: a rate tied with the best (paired seeds) at every width')
  depth = claims.Claim('m', 'p', 'transfers', 'n/a', 'exp', claims.Transfers('fam'))
  assert claims.evaluate({('exp', 'tiny'): loader.load(str(tmp_path))}, (depth,)).iloc[0].verdict == claims.CONTRADICTS
  with pytest.raises(ValueError, match="Transfers.axis='D': allowed L, d"):
    claims.Transfers('fam', axis='D')


@pytest.mark.parametrize('l2_at_0p1, verdict', [
    ([2.05, 2.05, 2.25], claims.REPRODUCES),  # not separated from L2's best: tied
    ([2.3, 2.4, 2.5], claims.NOT_AT_SIZE)])  # separated: the tied sets are a step apart
def test_transfer_rule_ties_the_rates_that_paired_seeds_do_not_separate(tmp_path, l2_at_0p1, verdict):
  """The best mean moves one grid step from L2 (0.01) to L8 (0.1) in both cases; whether 0.1
  is tied with L2's best decides."""
  losses = {'fam_L2_lr0.001': [3.0, 3.1, 3.2], 'fam_L2_lr0.01': [2.0, 2.1, 2.2],
            'fam_L2_lr0.1': l2_at_0p1, 'fam_L8_lr0.001': [3.0, 3.1, 3.2],
            'fam_L8_lr0.01': [2.5, 2.6, 2.7], 'fam_L8_lr0.1': [1.9, 2.0, 2.1]}
  rule = claims.Claim('m', 'p', 'transfers', 'n/a', 'exp', claims.Transfers('fam'))
  row = claims.evaluate({('exp', 'tiny'): ladder(tmp_path, losses)}, (rule,)).iloc[0]
  assert row.verdict == verdict
  tied_l2 = '0.01, 0.1' if verdict == claims.REPRODUCES else '0.01'
  assert row.gap == f'depth 2: tied with the best at {tied_l2}; depth 8: tied with the best at 0.1'


def test_transfer_rows_read_the_rung_names_of_repro_depth_transfer(tmp_path):
  module = experiment.load_module(os.path.join(ROOT, 'experiments', 'repro_depth_transfer.py'))
  rungs = experiment.rungs_of(module, 'cpu')
  losses = {r.name: [3.0 - (r.overrides['optim.lr'] == 1e-2)] for r in rungs}  # best at 1e-2 at every depth
  table = claims.evaluate({('repro_depth_transfer', 'cpu'): ladder(tmp_path, losses, lambda v, k: v)})
  ours = table[table.measured_by == 'repro_depth_transfer:cpu']
  assert len(ours) == 3 and set(ours.verdict) == {claims.REPRODUCES}
  assert ours.measured.iloc[0].startswith('depth_mup_L2_lr0.01 2.000 (1 seed')


def test_a_notebook_asserts_its_rows_at_the_size_it_ran(tmp_path, capsys):
  from depthscale.results import notebook
  res = ladder(tmp_path, {'pre_ln': [2.0, 2.01, 2.02], 'post_ln': [3.5, 3.51, 3.52]})
  xiong = 'without warmup at a large rate Post-LN trains far worse than Pre-LN'
  measured = notebook.claims_rows('repro_pre_vs_post_ln', 'tiny', res, {'tiny': {xiong: claims.REPRODUCES}})
  assert measured == {xiong: claims.REPRODUCES}  # its other rows name variants this ladder lacks
  assert 'claims verdicts as expected at tiny' in capsys.readouterr().out
  with pytest.raises(AssertionError, match='verdicts at tiny'):
    notebook.claims_rows('repro_pre_vs_post_ln', 'tiny', res, {'tiny': {xiong: claims.NOT_AT_SIZE}})
  assert notebook.claims_rows('repro_pre_vs_post_ln', 'tiny', res, {'smoke': {}}) == measured
  assert "no verdicts recorded for size 'tiny' (recorded: smoke)" in capsys.readouterr().out


def test_command_writes_the_table(tmp_path, capsys):
  ladder(tmp_path / 'runs', {'pre_ln': [2.0, 2.01, 2.02], 'post_ln': [3.5, 3.51, 3.52]})
  out = tmp_path / 'claims.md'
  claims_cli.main(['--runs', f'repro_pre_vs_post_ln:tiny={tmp_path / "runs"}', '--out', str(out),
                   '--note', 'a test'])
  text = out.read_text()
  assert 'Runs read: repro_pre_vs_post_ln:tiny. a test.' in text
  rows = [l for l in text.splitlines() if l.startswith('| ') and 'repro_pre_vs_post_ln:tiny' in l]
  xiong = [l for l in rows if 'Xiong' in l and 'far worse' in l]
  assert len(xiong) == 1 and xiong[0].endswith('| reproduces | pre_ln below post_ln, separated '
                                                '(above: contradicts; not separated: does not at this size) |')
  assert '| pre_ln - post_ln -1.500 [-1.500, -1.500] (3 paired seeds) |' in xiong[0]
  assert 'pre_ln 2.010 [' in xiong[0]
  assert text.count('\n| ') == len(claims.CLAIMS) + 1  # header, one row per claim
  assert 'reproduces' in capsys.readouterr().out
  with pytest.raises(SystemExit):
    claims_cli.main(['--runs', 'no_size=' + str(tmp_path)])


def test_every_method_of_docs_methods_has_a_row():
  text = open(os.path.join(ROOT, 'docs', 'methods.md')).read()
  methods, in_table = set(), False
  for line in text.splitlines():
    if line.startswith('| method |'):
      in_table = True
    elif not line.startswith('|'):
      in_table = False
    elif in_table and not line.startswith('|---'):
      methods.add(line.split('|')[1].strip())
  assert len(methods) > 50
  assert methods <= {c.method for c in claims.CLAIMS}, methods - {c.method for c in claims.CLAIMS}
  for c in claims.CLAIMS:
    assert c.reported and c.claim and '\n' not in c.claim
    assert re.search(r'(19|20)\d\d|arXiv|GPT|PaLM|studies', c.paper), c.paper


def test_every_rule_names_variants_of_its_ladder():
  """A rule's variants are rung names (less the seed part) of its experiment's ladder at one
  of its sizes (or its only one), so no row is 'not measured' by a typo."""
  for c in claims.CLAIMS:
    if c.rule is None:
      continue
    path = os.path.join(ROOT, 'experiments', c.experiment + '.py')
    module = experiment.load_module(path)
    sizes = list(getattr(module, 'SIZES', {})) or [None]  # None: a file without sizes
    names = {intervals.variant(r.name) for arg in sizes for r in experiment.rungs_of(module, arg)}
    if isinstance(c.rule, claims.Transfers):
      assert any(n.startswith(f'{c.rule.family}_{c.rule.axis}') for n in names), c.claim
    else:
      pairs = (c.rule.first, c.rule.second) if isinstance(c.rule, claims.Both) else (c.rule,)
      named = {v for p in pairs for v in (p.a, p.b)}
      assert named <= names, (c.claim, named - names)


@pytest.mark.parametrize('b_losses, verdict', [
    ([3.0, 2.5, 2.9, 3.3], claims.REPRODUCES),  # b within 5% of its best at 3e-3 only
    ([2.5, 2.55, 2.6, 2.62], claims.CONTRADICTS),  # b at all four
    ([3.0, 2.5, 2.6, 3.3], claims.NOT_AT_SIZE),  # both at two rates
])
def test_rate_sensitivity_counts_the_rates_near_each_variants_best(tmp_path, b_losses, verdict):
  grid = (1e-3, 3e-3, 1e-2, 3e-2)
  a_losses = [3.0, 2.5, 2.6, 3.3]  # a within 5% of 2.5 at 3e-3 and 1e-2
  rungs = {f'{v}_lr{r:g}': (r, x) for v, xs in (('a', a_losses), ('b', b_losses)) for r, x in zip(grid, xs)}
  rungs.update({f'{v}_best_s{k}': (3e-3, 2.5) for v in 'ab' for k in (1, 2)})
  for name, (lr, loss) in rungs.items():
    os.makedirs(tmp_path / name)
    (tmp_path / name / 'config.json').write_text(json.dumps({
        'model': {'num_layers': 2, 'd_model': 16}, 'data': {'seq_len': 16, 'source': 'grammar'},
        'optim': {'lr': lr}, 'train': {'seed': 0}}))
    (tmp_path / name / 'summary.json').write_text(json.dumps(
        {'final_eval_loss': loss, 'non_embedding_params': 6000, 'tokens': 100}))
  rule = claims.Claim('m', 'p', 'a is less rate-sensitive', 'n/a', 'exp', claims.Wider('a', 'b'))
  row = claims.evaluate({('exp', 'tiny'): loader.load(str(tmp_path))}, (rule,)).iloc[0]
  assert row.verdict == verdict
  assert row.gap.startswith('a within 5% at 0.003, 0.01; b within 5% at ')
  assert claims.evaluate({('exp', 'tiny'): ladder(tmp_path / 'none', {'a': [2.0], 'b': [2.0]})},
                         (rule,)).iloc[0].verdict == claims.NOT_MEASURED  # no sweep
