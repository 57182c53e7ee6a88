"""Learning-rate sweeps as a ladder feature (ladder.lr_sweep, depthscale.sweep) and their
results: best-rate selection, extensions past the edge of the grid, Student-t intervals and
the separated-interval ranking."""

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from depthscale import compare, experiment, results, sweep
from depthscale.errors import ConfigError
from depthscale.ladder import Extension, lr_name, lr_sweep
from depthscale.results import intervals, plots

EXPERIMENT = '''
from depthscale.config import default_config
from depthscale.ladder import lr_sweep

def get_config(arg=None):
  c = default_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads = 2, 16, 1
  c.data.source, c.data.seq_len, c.data.batch_size, c.data.eval_batches = 'grammar', 16, 2, 1
  c.train.steps = c.train.eval_every = c.train.checkpoint_every = 4
  c.metrics.analysis_every, c.metrics.images, c.metrics.analysis_batch_size = 0, False, 2
  c.optim.warmup_steps, c.optim.schedule, c.optim.clip_norm = 0, 'constant', 0.0
  return c

def get_ladder(arg=None):
  return lr_sweep({'pre': {'model.block': 'pre_ln'}}, [1e-2, 1e38], seeds=1, extend=2)
'''
GRID = {'a_lr1e-3': 1e-3, 'a_lr3e-3': 3e-3, 'a_lr1e-2': 1e-2}  # steps: 3 below, 10/3 above


def write_rung(ladder, name, lr, loss=None, diverged=False):
  os.makedirs(ladder / name, exist_ok=True)
  (ladder / name / 'config.json').write_text(json.dumps({'optim': {'lr': lr}}))
  if diverged:
    sweep.record_divergence(str(ladder / name), 'non-finite loss at step 3')
  elif loss is not None:
    (ladder / name / 'summary.json').write_text(json.dumps({'final_eval_loss': loss}))


def test_rung_names_and_stages():
  assert [lr_name(r) for r in (3e-3, 2.5e-4, 1e-2, 1e38)] == ['lr3e-3', 'lr2.5e-4', 'lr1e-2',
                                                                'lr1e38']
  rungs = lr_sweep({'a': {'model.block': 'pre_ln'}}, [1e-3, 3e-3], seeds=2)
  assert [r.name for r in rungs] == ['a_lr1e-3', 'a_lr3e-3', 'a_best_s1', 'a_best_s2']
  assert rungs[1].overrides == {'model.block': 'pre_ln', 'optim.lr': 3e-3, 'train.seed': 0}
  assert rungs[3].overrides == {'model.block': 'pre_ln', 'train.seed': 2}
  assert rungs[3].best_lr_of == ('a_lr1e-3', 'a_lr3e-3') and not rungs[0].best_lr_of
  with pytest.raises(ValueError, match='distinct positive rates'):
    lr_sweep({'a': {}}, [1e-3, 1.001e-3])


def test_finalists_train_the_seeds_at_each_of_the_best_rates():
  rungs = lr_sweep({'a': {}}, [1e-3, 3e-3, 1e-2], seeds=2, finalists=2)
  assert [r.name for r in rungs[3:]] == ['a_best_s1', 'a_best_s2', 'a_top2_s1', 'a_top2_s2']
  assert [r.lr_rank for r in rungs[3:]] == [1, 1, 2, 2]
  assert {r.overrides['train.seed'] for r in rungs[5:]} == {1, 2}  # the same seeds: they pair
  assert all(r.best_lr_of == ('a_lr1e-3', 'a_lr3e-3', 'a_lr1e-2') for r in rungs[3:])
  for bad in (0, 4, True):
    with pytest.raises(ValueError, match=r'^finalists='):
      lr_sweep({'a': {}}, [1e-3, 3e-3, 1e-2], finalists=bad)


def test_extension_rungs_follow_the_grid_and_join_stage_2():
  rungs = lr_sweep({'a': {'model.block': 'pre_ln'}}, [3e-3, 1e-3, 1e-2], seeds=1, extend=2)
  assert [r.name for r in rungs] == ['a_lr3e-3', 'a_lr1e-3', 'a_lr1e-2', 'a_lr_ext1', 'a_lr_ext2',
                                     'a_best_s1']
  ext1, ext2 = rungs[3].extension, rungs[4].extension
  assert ext1.after == ('a_lr3e-3', 'a_lr1e-3', 'a_lr1e-2') and ext2.after == ext1.after + ('a_lr_ext1',)
  assert ext2.up == pytest.approx(10 / 3) and ext2.down == pytest.approx(3)
  assert rungs[3].overrides == {'model.block': 'pre_ln', 'train.seed': 0}  # its rate: decided at start
  assert rungs[5].best_lr_of == tuple(r.name for r in rungs[:5]) == rungs[5].needs
  assert rungs[4].needs == ext2.after and rungs[0].extension is None and not rungs[0].needs
  for bad in (-1, 1.5, True, '2'):
    with pytest.raises(ValueError, match=r'^extend=.*: allowed an int >= 0$'):
      lr_sweep({'a': {}}, [1e-3, 3e-3], extend=bad)


@pytest.mark.parametrize('losses, lr, best', [
    ((3.0, 2.9, 2.8), 1e-2 * 10 / 3, 'a_lr1e-2'),  # best at the top: one step above it
    ((2.8, 2.9, 3.0), 1e-3 / 3, 'a_lr1e-3'),  # at the bottom: one step below
    ((2.9, 2.8, 3.0), None, 'a_lr3e-3'),  # inside: not needed
    ((None, None, None), 1e-3 / 3, 'a_lr1e-3'),  # every rate diverged: below the lowest
])
def test_an_extension_goes_past_the_edge_the_best_rate_is_at(tmp_path, losses, lr, best):
  for (name, rate), loss in zip(GRID.items(), losses):
    write_rung(tmp_path, name, rate, loss=loss, diverged=loss is None)
  ext = Extension(tuple(GRID), up=1e-2 / 3e-3, down=3e-3 / 1e-3)
  chosen = sweep.extend(str(tmp_path), 'a_lr_ext1', ext)
  assert chosen == (lr and pytest.approx(lr, rel=1e-12))
  record = json.loads((tmp_path / 'a_lr_ext1' / sweep.EXTENSION_FILE).read_text())
  assert record == {'needed': lr is not None, 'lr': chosen, 'from': best,
                    'losses': dict(zip(GRID, losses))}
  assert sweep.not_needed(str(tmp_path / 'a_lr_ext1')) == (lr is None)
  assert sweep.unfinished(str(tmp_path), ('a_lr_ext1',)) == ([] if lr is None else ['a_lr_ext1'])


def test_extensions_go_on_until_one_diverges_and_stage_2_chooses_among_them(tmp_path):
  rungs = lr_sweep({'a': {}}, list(GRID.values()), seeds=1, extend=3)
  ext1, ext2, ext3 = (r.extension for r in rungs[3:6])
  ladder = str(tmp_path)
  for (name, rate), loss in zip(GRID.items(), (3.0, 2.9, 2.8)):
    write_rung(tmp_path, name, rate, loss=loss)
  with pytest.raises(ConfigError, match='a_best_s1 needs its finished learning-rate sweep: a_lr_ext1, '):
    sweep.choose(ladder, 'a_best_s1', rungs[6].best_lr_of)
  lr1 = sweep.extend(ladder, 'a_lr_ext1', ext1)
  write_rung(tmp_path, 'a_lr_ext1', lr1, loss=2.7)  # lower still: the next one goes further up
  lr2 = sweep.extend(ladder, 'a_lr_ext2', ext2)
  assert lr1 == 1e-2 * ext1.up and lr2 == lr1 * ext2.up
  write_rung(tmp_path, 'a_lr_ext2', lr2, diverged=True)  # the edge diverges: stop there
  assert sweep.extend(ladder, 'a_lr_ext3', ext3) is None
  assert sweep.choose(ladder, 'a_best_s1', rungs[6].best_lr_of) == lr1
  record = json.loads((tmp_path / 'a_best_s1' / sweep.CHOICE_FILE).read_text())
  assert record['from'] == 'a_lr_ext1' and list(record['losses']) == list(GRID) + ['a_lr_ext1',
                                                                                  'a_lr_ext2']
  write_rung(tmp_path, 'a_lr_ext1', lr1, loss=9.0)  # a rerun keeps the rate recorded at start
  assert sweep.extend(ladder, 'a_lr_ext2', ext2) == lr2


def test_best_rate_counts_diverged_and_non_finite_as_worst(tmp_path):
  write_rung(tmp_path, 'a_lr1e-3', 1e-3, loss=3.0)
  write_rung(tmp_path, 'a_lr3e-3', 3e-3, loss=2.5)
  write_rung(tmp_path, 'a_lr1e-2', 1e-2, diverged=True)
  write_rung(tmp_path, 'a_lr3e-2', 3e-2, loss=float('nan'))
  names = ('a_lr1e-3', 'a_lr3e-3', 'a_lr1e-2', 'a_lr3e-2')
  assert sweep.choose(str(tmp_path), 'a_best_s1', names) == 3e-3
  record = json.loads((tmp_path / 'a_best_s1' / sweep.CHOICE_FILE).read_text())
  assert record == {'lr': 3e-3, 'from': 'a_lr3e-3', 'rank': 1, 'losses': {
      'a_lr1e-3': 3.0, 'a_lr3e-3': 2.5, 'a_lr1e-2': None, 'a_lr3e-2': None}}
  assert sweep.choose(str(tmp_path), 'a_top2_s1', names, rank=2) == 1e-3  # the second best
  assert json.loads((tmp_path / 'a_top2_s1' / sweep.CHOICE_FILE).read_text())['from'] == 'a_lr1e-3'
  assert sweep.best({'x': math.inf, 'y': float('nan'), 'z': 9.0}) == 'z'
  with pytest.raises(ConfigError, match='2 rates of its sweep stayed finite, it trains at the rank 3'):
    sweep.choose(str(tmp_path), 'a_top3_s1', names, rank=3)  # a diverged rate is never a finalist
  with pytest.raises(ConfigError, match='0 rates of its sweep stayed finite'):
    sweep.choose(str(tmp_path), 'a_best_s1', ('a_lr1e-2', 'a_lr3e-2'))
  write_rung(tmp_path, 'a_lr1e-1', 0.1)  # started, not finished
  with pytest.raises(ConfigError, match='a_best_s1 needs its finished learning-rate sweep: a_lr1e-1 not'):
    sweep.choose(str(tmp_path), 'a_best_s1', names + ('a_lr1e-1',))


def test_t_interval_matches_scipy_and_the_textbook_formula():
  rng = np.random.default_rng(0)
  for n in (2, 3, 7):
    v = rng.normal(3.0, 0.2, n)
    mean, low, high = intervals.t_interval(v)
    ref = stats.t.interval(0.95, n - 1, loc=v.mean(), scale=stats.sem(v))
    np.testing.assert_allclose([low, high], ref, rtol=1e-12)
    assert mean == pytest.approx(v.mean(), rel=1e-15)
  v = np.array([2.0, 2.2, 2.7])  # t_{0.975, 2} = 4.303 (Student's table)
  half = 4.302652729911275 * np.std(v, ddof=1) / np.sqrt(3)
  np.testing.assert_allclose(intervals.t_interval(v)[1:], [v.mean() - half, v.mean() + half])
  assert np.isnan(intervals.t_interval([2.0])[1])


def test_ranking_orders_only_separated_intervals():
  choices = pd.DataFrame([{'rung': f'{v}_best_s{k}', 'lr': lr, 'from': '', 'losses': {'x': 1, 'y': 2}}
                          for v, lr in (('a', 1e-3), ('b', 3e-3), ('c', 1e-2)) for k in (1, 2, 3)])
  loss = {'a': [2.00, 2.01, 2.02], 'b': [2.50, 2.52, 2.51], 'c': [2.4, 2.7, 2.55]}
  summaries = pd.DataFrame([{'rung': f'{v}_best_s{k + 1}', 'final_eval_loss': x}
                            for v, xs in loss.items() for k, x in enumerate(xs)])
  table = intervals.sweep_table(choices, summaries, pd.DataFrame(columns=['rung', 'optim.lr']))
  assert list(table.variant) == ['a', 'b', 'c'] and list(table['rank']) == [1, 2, 2]
  assert list(table.seeds) == [3, 3, 3] and list(table.rates) == [2, 2, 2]
  assert list(table.edge) == ['', '', '']  # stage-1 rungs without configs: no rates to be at the edge of
  configs = pd.DataFrame({'rung': ['v_lr1e-3', 'v_lr3e-3', 'v_lr1e-2', 'v_lr_ext1', 'v_lr_ext2'],
                          'optim.lr': [1e-3, 3e-3, 1e-2, 1e-2 * 10 / 3, 1e-2 * (10 / 3) ** 2]})
  grid = {'v_lr1e-3': 2.0, 'v_lr3e-3': 1.9, 'v_lr1e-2': None}  # a diverged rate is in the grid
  assert [intervals.edge(r, grid, configs) for r in (1e-3, 3e-3, 1e-2)] == ['lowest', '', 'highest']
  extended = {**grid, 'v_lr1e-2': 1.8, 'v_lr_ext1': 1.7}  # the best an extension: still an edge
  assert intervals.edge(1e-2 * 10 / 3, extended, configs) == 'highest'
  assert intervals.edge(1e-2 * 10 / 3, {**extended, 'v_lr_ext2': None}, configs) == ''
  assert table.set_index('variant').lr.to_dict() == {'a': 1e-3, 'b': 3e-3, 'c': 1e-2}
  assert intervals.ranking(table) == ['a < b', 'a < c', 'b ~ c (tied)']


def test_the_rate_is_the_finalist_with_the_lowest_mean_over_seeds(tmp_path):
  stage1 = {'a_lr1e-3': (1e-3, 3.0), 'a_lr1e-2': (1e-2, 2.6), 'a_lr3e-2': (3e-2, 2.5)}
  stage2 = {'a_best_s': (3e-2, [2.4, 3.3, 2.9]), 'a_top2_s': (1e-2, [2.55, 2.6, 2.65])}
  rungs = {n: (lr, 0, loss) for n, (lr, loss) in stage1.items()}  # seed 0 chose 3e-2...
  rungs.update({f'{n}{k}': (lr, k, x) for n, (lr, xs) in stage2.items() for k, x in enumerate(xs, 1)})
  for name, (lr, seed, loss) in rungs.items():
    os.makedirs(tmp_path / name)
    (tmp_path / name / 'config.json').write_text(json.dumps({
        'model': {'num_layers': 2, 'd_model': 16}, 'data': {'seq_len': 16}, 'optim': {'lr': lr},
        'train': {'seed': seed}}))
    (tmp_path / name / 'summary.json').write_text(json.dumps(
        {'final_eval_loss': loss, 'non_embedding_params': 6000, 'tokens': 100}))
    if '_s' in name:
      (tmp_path / name / sweep.CHOICE_FILE).write_text(json.dumps(
          {'lr': lr, 'from': '', 'rank': 1 + ('top2' in name), 'losses': {n: l for n, (_, l) in stage1.items()}}))
  res = results.load(str(tmp_path))
  row = res.sweep().iloc[0]  # ...over seeds 1-3, 1e-2 is lower on average: the variant's rate
  assert (row.variant, row.lr, row.seeds, row.rates) == ('a', 1e-2, 3, 3)
  assert row['mean'] == pytest.approx(2.6) and row.edge == ''
  points = res.rate_points()
  assert len(points) == 9 and set(points.variant) == {'a'}
  assert points.groupby('lr').seed.apply(sorted).to_dict() == {1e-3: [0], 1e-2: [0, 1, 2, 3], 3e-2: [0, 1, 2, 3]}
  fig = plots.loss_vs_lr_figure(points, {'a': 1e-2})
  ring = [l for l in fig.axes[0].lines if l.get_markersize() == 11]
  assert len(ring) == 1 and list(ring[0].get_xdata()) == [1e-2]
  assert list(ring[0].get_ydata()) == [pytest.approx(np.mean([2.6, 2.55, 2.6, 2.65]))]  # the mean line's point


def test_sweep_view_lists_every_pair_only_for_a_few_variants():
  def view(n: int) -> str:
    rows = [{'variant': f'v{i}', 'lr': 1e-3, 'rates': 4, 'edge': '', 'seeds': 3, 'mean': 2.0 + i,
             'low': 1.9 + i, 'high': 2.1 + i, 'rank': i + 1} for i in range(n)]
    return compare.sweep_view(SimpleNamespace(sweep=lambda: pd.DataFrame(rows)))
  few = view(compare.PAIRWISE_MAX).splitlines()[-1]
  assert few.startswith('ranking: v0 < v1; v0 < v2') and few.count(' < ') == 15
  many = view(compare.PAIRWISE_MAX + 1).splitlines()[-1]
  assert many == ('ranking: 7 variants: each one\'s rank is 1 + the variants whose interval '
                  'lies wholly below its own')


@pytest.mark.slow  # trains and resumes a sweep ladder
def test_an_extended_sweep_runs_resumes_and_selects_rungs(tmp_path, capsys):
  path = tmp_path / 'sweep.py'
  path.write_text(EXPERIMENT)
  ladder = str(tmp_path / 'ladder')
  with pytest.raises(ConfigError, match=r'^--rung=pre_best_s1 needs its finished learning-rate '
                                        r'sweep: pre_lr1e-2, pre_lr1e38, pre_lr_ext1, pre_lr_ext2 '
                                        r'not finished in'):
    experiment.run_ladder(str(path), ladder, rung='pre_best_s1')
  with pytest.raises(ConfigError, match=r'^--rung=pre_lr_ext2 needs its finished learning-rate '
                                        r'sweep: pre_lr1e-2, pre_lr1e38, pre_lr_ext1 not finished in'):
    experiment.run_ladder(str(path), ladder, rung='pre_lr_ext2')
  with pytest.raises(ConfigError, match='optim.lr .command line. cannot be set'):
    experiment.run_ladder(str(path), ladder, {'optim.lr': 1e-3})
  rows = experiment.run_ladder(str(path), ladder)
  assert [r['rung'] for r in rows] == ['pre_lr1e-2', 'pre_lr_ext1', 'pre_best_s1']
  assert os.path.exists(os.path.join(ladder, 'pre_lr1e38', sweep.DIVERGED_FILE))
  out = capsys.readouterr().out
  assert 'pre_lr1e38: diverged, the worst rate' in out and 'rung pre_lr_ext2: not needed' in out
  ext1 = json.load(open(os.path.join(ladder, 'pre_lr_ext1', sweep.EXTENSION_FILE)))
  assert ext1['needed'] and ext1['from'] == 'pre_lr1e-2'  # 1e38 diverged: 1e-2 best, the lowest
  assert ext1['lr'] == 1e-2 / (1e38 / 1e-2) == sweep.rate(ladder, 'pre_lr_ext1')
  ext2 = open(os.path.join(ladder, 'pre_lr_ext2', sweep.EXTENSION_FILE)).read()
  assert json.loads(ext2)['needed'] is False and json.loads(ext2)['from'] == 'pre_lr1e-2'
  assert os.listdir(os.path.join(ladder, 'pre_lr_ext2')) == [sweep.EXTENSION_FILE]  # not trained
  choice = json.load(open(os.path.join(ladder, 'pre_best_s1', sweep.CHOICE_FILE)))
  assert list(choice['losses']) == ['pre_lr1e-2', 'pre_lr1e38', 'pre_lr_ext1']
  cfg = json.load(open(os.path.join(ladder, 'pre_best_s1', 'config.json')))
  assert cfg['optim']['lr'] == 1e-2 and cfg['train']['seed'] == 1
  trained = os.stat(os.path.join(ladder, 'pre_lr_ext1', 'summary.json')).st_mtime_ns
  assert experiment.run_ladder(str(path), ladder) == rows  # finished: nothing redone
  assert os.stat(os.path.join(ladder, 'pre_lr_ext1', 'summary.json')).st_mtime_ns == trained
  assert open(os.path.join(ladder, 'pre_lr_ext2', sweep.EXTENSION_FILE)).read() == ext2
  again = experiment.run_ladder(str(path), ladder, rung='pre_best_s1')  # finished: skipped
  assert again == rows[2:]
  res = results.load(ladder)
  assert 'pre_lr_ext2' not in set(res.configs.rung)
  _, written = compare.compare(ladder)
  assert os.path.join(ladder, 'compare', 'loss_vs_lr.png') in written
  assert res.sweep().to_dict('records') == [{
      'variant': 'pre', 'lr': 1e-2, 'rates': 3, 'edge': '', 'seeds': 1, 'mean': rows[2]['eval_loss'],
      'low': pytest.approx(np.nan, nan_ok=True), 'high': pytest.approx(np.nan, nan_ok=True),
      'rank': 1}]  # the extension below 1e-2 did worse: 1e-2 is no longer the lowest rate


def test_a_bad_rung_names_the_closest_rungs_of_a_long_ladder():
  rungs = lr_sweep({f'v{i}': {} for i in range(20)}, [1e-3, 1e-2], seeds=1)
  with pytest.raises(ConfigError) as e:
    experiment.select(rungs, 'v3_lr0.01')
  message = str(e.value)
  assert message.startswith("--rung='v3_lr0.01' is invalid: allowed 0..59 or one of 60 names, closest: v3_lr1e-")
  assert len(message) < 200 and '\n' not in message
  with pytest.raises(ConfigError, match=r"allowed 0\.\.2 or one of v0_lr1e-3, v0_lr1e-2, v0_best_s1$"):
    experiment.select(rungs[:3], 'x')
