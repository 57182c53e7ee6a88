"""Learning-rate sweeps as a ladder feature (ladder.lr_sweep, depthscale.sweep) and their
results: best-rate selection, Student-t intervals and the separated-interval ranking."""

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
from depthscale.ladder import lr_name, lr_sweep
from depthscale.results import intervals

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
  return lr_sweep({'pre': {'model.block': 'pre_ln'}}, [1e-2, 1e38], seeds=1)
'''


def write_rung(ladder, name, lr, loss=None, diverged=False):
  os.makedirs(ladder / name)
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


def test_best_rate_counts_diverged_and_non_finite_as_worst(tmp_path):
  write_rung(tmp_path, 'a_lr1e-3', 1e-3, loss=3.0)
  write_rung(tmp_path, 'a_lr3e-3', 3e-3, loss=2.5)
  write_rung(tmp_path, 'a_lr1e-2', 1e-2, diverged=True)
  write_rung(tmp_path, 'a_lr3e-2', 3e-2, loss=float('nan'))
  names = ('a_lr1e-3', 'a_lr3e-3', 'a_lr1e-2', 'a_lr3e-2')
  assert sweep.choose(str(tmp_path), 'a_best_s1', names) == 3e-3
  record = json.loads((tmp_path / 'a_best_s1' / sweep.CHOICE_FILE).read_text())
  assert record == {'lr': 3e-3, 'from': 'a_lr3e-3', 'losses': {
      'a_lr1e-3': 3.0, 'a_lr3e-3': 2.5, 'a_lr1e-2': None, 'a_lr3e-2': None}}
  assert sweep.best({'x': math.inf, 'y': float('nan'), 'z': 9.0}) == 'z'
  with pytest.raises(ConfigError, match='every rate of its sweep diverged'):
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
  table = intervals.sweep_table(choices, summaries)
  assert list(table.variant) == ['a', 'b', 'c'] and list(table['rank']) == [1, 2, 2]
  assert list(table.seeds) == [3, 3, 3] and list(table.rates) == [2, 2, 2]
  assert list(table.edge) == ['', '', '']  # rung names without rates: no grid to be at the edge of
  grid = {'v_lr1e-3': 2.0, 'v_lr3e-3': 1.9, 'v_lr1e-2': None}  # a diverged rate is in the grid
  assert [intervals.edge(r, grid) for r in (1e-3, 3e-3, 1e-2)] == ['lowest', '', 'highest']
  assert table.set_index('variant').lr.to_dict() == {'a': 1e-3, 'b': 3e-3, 'c': 1e-2}
  assert intervals.ranking(table) == ['a < b', 'a < c', 'b ~ c (tied)']


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


def test_sweep_runs_resumes_and_selects_rungs(tmp_path, capsys):
  path = tmp_path / 'sweep.py'
  path.write_text(EXPERIMENT)
  ladder = str(tmp_path / 'ladder')
  with pytest.raises(ConfigError, match=r'^--rung=pre_best_s1 needs its finished learning-rate '
                                        r'sweep: pre_lr1e-2, pre_lr1e38 not finished in'):
    experiment.run_ladder(str(path), ladder, rung='pre_best_s1')
  with pytest.raises(ConfigError, match='optim.lr .command line. cannot be set'):
    experiment.run_ladder(str(path), ladder, {'optim.lr': 1e-3})
  rows = experiment.run_ladder(str(path), ladder)
  assert [r['rung'] for r in rows] == ['pre_lr1e-2', 'pre_best_s1']
  assert os.path.exists(os.path.join(ladder, 'pre_lr1e38', sweep.DIVERGED_FILE))
  cfg = json.load(open(os.path.join(ladder, 'pre_best_s1', 'config.json')))
  assert cfg['optim']['lr'] == 1e-2 and cfg['train']['seed'] == 1
  assert 'pre_lr1e38: diverged, the worst rate' in capsys.readouterr().out
  again = experiment.run_ladder(str(path), ladder, rung='pre_best_s1')  # finished: skipped
  assert again == rows[1:]
  sweep_table = results.load(ladder).sweep()
  assert sweep_table.to_dict('records') == [{
      'variant': 'pre', 'lr': 1e-2, 'rates': 2, 'edge': 'lowest', 'seeds': 1, 'mean': rows[1]['eval_loss'],
      'low': pytest.approx(np.nan, nan_ok=True), 'high': pytest.approx(np.nan, nan_ok=True),
      'rank': 1}]
