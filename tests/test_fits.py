"""Power-law fits and training FLOPs: the plain law is the float64 log-log regression, the
saturating law recovers known parameters of noisy synthetic ladders within its intervals
(covariance and bootstrap over seeds), degenerate ladders say why they are not determined,
and compare / results.load show the fits, FLOPs and iso-FLOP groups of a ladder directory."""

import json

import matplotlib.image
import numpy as np
import pytest
from scipy import stats

from depthscale import compare, results
from depthscale.config import default_config
from depthscale.results import fits, flops

X = np.geomspace(1e4, 1e7, 8)
TRUTH = {'E': 1.8, 'A': 40.0, 'alpha': 0.3}


def _ladder_losses(x, truth, sigma, seed):
  """Losses of the law `truth` at x with multiplicative log-normal noise (std sigma)."""
  noise = np.exp(sigma * np.random.default_rng(seed).standard_normal(len(x)))
  return (truth.get('E', 0.0) + truth['A'] * np.asarray(x) ** -truth['alpha']) * noise


def _covers(fit, truth):
  return {k: fit.intervals[k][0] <= v <= fit.intervals[k][1] for k, v in truth.items()}


def test_plain_power_law_is_the_float64_log_log_regression():
  truth = {'A': 40.0, 'alpha': 0.3}
  y = _ladder_losses(X, truth, 0.02, seed=1)
  fit = fits.fit_power_law(X, y)
  assert fit.form == fits.PLAIN and 'E not identified' in fit.notes[0]
  lx, ly = np.log(X), np.log(y)  # textbook OLS of log y on log x
  sxx = np.sum((lx - lx.mean()) ** 2)
  slope = np.sum((lx - lx.mean()) * (ly - ly.mean())) / sxx
  icpt = ly.mean() - slope * lx.mean()
  s2 = np.sum((ly - icpt - slope * lx) ** 2) / (len(X) - 2)
  se_slope, se_icpt = np.sqrt(s2 / sxx), np.sqrt(s2 * (1 / len(X) + lx.mean() ** 2 / sxx))
  t = stats.t.ppf(0.975, len(X) - 2)
  assert fit.params['alpha'] == pytest.approx(-slope, rel=1e-9)
  assert fit.params['A'] == pytest.approx(np.exp(icpt), rel=1e-9)
  assert fit.intervals['alpha'] == pytest.approx((-slope - t * se_slope, -slope + t * se_slope),
                                                 rel=1e-7)
  assert fit.intervals['A'] == pytest.approx(np.exp([icpt - t * se_icpt, icpt + t * se_icpt]),
                                             rel=1e-7)
  assert all(_covers(fit, truth).values())


def test_saturating_law_is_exact_on_clean_data_and_the_least_squares_minimum():
  clean = fits.fit_power_law(X, _ladder_losses(X, TRUTH, 0.0, 0))
  assert clean.form == fits.SATURATING
  assert clean.params == pytest.approx(TRUTH, rel=1e-6)
  y = _ladder_losses(X, TRUTH, 0.01, seed=2)
  fit = fits.fit_power_law(X, y)
  ssr = lambda e, a, al: np.sum((np.log(e + a * X[:, None] ** -al) - np.log(y[:, None])) ** 2, 0)
  e, a, al = (g.ravel() for g in np.meshgrid(np.linspace(0, y.min() * 0.999, 60),
                                            np.geomspace(5, 300, 60), np.linspace(0.05, 1, 60)))
  grid = ssr(e[None], a[None], al[None])  # a float64 grid search: no lower sum of squares
  assert ssr(*(np.array([fit.params[k]]) for k in ('E', 'A', 'alpha')))[0] <= grid.min() + 1e-12


def test_saturating_law_recovers_known_parameters_within_its_intervals():
  one_seed = fits.fit_power_law(X, _ladder_losses(X, TRUTH, 0.01, seed=3))
  x5 = np.repeat(X[::2], 5)  # 4 points, 5 seeds each: bootstrap over seeds
  seeds = fits.fit_power_law(x5, _ladder_losses(x5, TRUTH, 0.01, seed=4))
  for fit, method in ((one_seed, 'covariance'), (seeds, 'bootstrap')):
    assert fit.form == fits.SATURATING and method in fit.method, fit.describe()
    assert all(_covers(fit, TRUTH).values()), fit.describe()
    assert fit.intervals['E'][1] - fit.intervals['E'][0] < 0.5  # informative, not vacuous
  assert seeds.seeds.tolist() == [5] * 4
  assert seeds.std == pytest.approx([np.std(g, ddof=1) for g in np.split(
      _ladder_losses(x5, TRUTH, 0.01, seed=4), 4)])
  assert seeds.predict(X) == pytest.approx(_ladder_losses(X, TRUTH, 0.0, 0), rel=0.02)


def test_degenerate_ladders_say_why_they_are_not_determined():
  two = fits.fit_power_law([1e5, 1e6], [3.0, 2.9], 'two')
  flat = fits.fit_power_law(X, 3.0 + 0.01 * np.random.default_rng(5).standard_normal(8), 'flat')
  const = fits.fit_power_law(X[:4], np.full(4, 2.5), 'const')
  holes = fits.fit_power_law([1e5, 1e6, 1e7, 1e7], [3.0, np.nan, 2.8, np.inf], 'holes')
  budget = fits.fit_power_law([394496, 395392, 397376], [2.5, 2.7, 2.9], 'budget')
  for fit in (two, flat, const, holes, budget):
    assert not fit.determined and fit.describe().startswith(f'{fit.label}: not determined: ')
  assert 'too few points: 2 distinct x' in two.describe()
  assert 'flat curve' in flat.describe() and 'flat curve' in const.describe()
  assert 'too few points: 2' in holes.describe() and '2 rungs without a finite' in holes.describe()
  assert 'x spans a factor of 1.01 only' in budget.describe()
  three = fits.fit_power_law(X[:3], _ladder_losses(X[:3], TRUTH, 0.0, 0))
  assert three.form == fits.PLAIN and '3 points: E not fitted' in three.notes[0]


def test_isoflop_groups_by_relative_tolerance():
  got = flops.isoflop_groups([100, 300, 108, 114, 320, 1000], tolerance=0.1)
  assert [g.tolist() for g in got] == [[0, 2], [1, 4]]  # 114 > 1.1 * 100 starts a group of one
  assert flops.isoflop_groups([1, 2, 4]) == []


def _write_rung(root, name, overrides, summary):
  cfg = default_config()
  for key, value in overrides.items():
    section, field = key.split('.')
    cfg[section][field] = value
  (root / name).mkdir()
  (root / name / 'config.json').write_text(json.dumps(cfg.to_dict()))
  (root / name / 'summary.json').write_text(json.dumps(
      {'final_train_loss': summary['final_eval_loss'], 'tokens_per_sec': 1e4, 'compile_s': 1.0,
       'params': summary['non_embedding_params'] + 1000, **summary}))


def test_compare_and_results_show_fits_flops_and_isoflop_groups(tmp_path, capsys):
  """A ladder directory without training: a depth sweep at D=64 (3 seeds per depth, loss from a
  known saturating law in L) and, trained 10x longer, two equal-budget shapes d128/L2 and
  d32/L32 (1 seed; FLOPs 12% apart)."""
  law = {'E': 2.0, 'A': 1.5, 'alpha': 0.7}
  for depth in (2, 4, 8, 16, 32):
    for seed in range(3):
      n = 12 * depth * 64 ** 2
      loss = _ladder_losses([depth], law, 0.002, seed=depth * 10 + seed)[0]
      _write_rung(tmp_path, f'L{depth}_s{seed}', {'model.num_layers': depth, 'model.d_model': 64,
                                                 'train.seed': seed, 'data.seq_len': 64},
                  {'non_embedding_params': n, 'tokens': 1000 * 64, 'final_eval_loss': loss})
  for d, depth, loss in ((128, 2, 2.6), (32, 32, 2.9)):
    _write_rung(tmp_path, f'wide_d{d}_L{depth}', {'model.num_layers': depth, 'model.d_model': d,
                                                  'model.block': 'post_ln', 'data.seq_len': 64},
                {'non_embedding_params': 12 * 8 * 64 ** 2, 'tokens': 10000 * 64,
                 'final_eval_loss': loss})
  res = results.load(str(tmp_path))
  s = res.summaries.set_index('rung')
  assert s.loc['L8_s1', 'flops'] == 6 * 64000 * (12 * 8 * 64 ** 2 + 8 * 64 * 64)
  pts = res.points().set_index('rung')
  assert pts.loc['L8_s1'].to_dict() == {
      'variant': 'block=pre_ln', 'seed': 1, 'L': 8, 'D': 64, 'params': 12 * 8 * 64 ** 2,
      'tokens': 64000, 'flops': s.loc['L8_s1', 'flops'], 'loss': s.loc['L8_s1', 'final_eval_loss']}
  with pytest.raises(ValueError, match="against='width': allowed"):
    res.fit('width')
  by_depth = {f.label: f for f in res.fit('depth')}
  pre = by_depth['block=pre_ln, D=64: loss vs depth L']
  assert pre.form == fits.SATURATING and 'bootstrap' in pre.method
  assert all(_covers(pre, law).values()), pre.describe()
  assert not by_depth['block=post_ln, D=128: loss vs depth L'].determined
  groups = res.isoflop()
  assert len(groups) == 1 and sorted(groups[0].rung) == ['wide_d128_L2', 'wide_d32_L32']

  compare.main([str(tmp_path), '--isoflop_tolerance=0.2'])
  out = capsys.readouterr().out
  header = out.splitlines()[0].split()
  assert header[-1] == 'flops'
  row = next(line.split() for line in out.splitlines() if line.startswith('L8_s1 '))
  assert float(row[-1]) == pytest.approx(s.loc['L8_s1', 'flops'], rel=5e-3)
  assert pre.describe().splitlines()[0] in out
  assert '1 variant with one params each: not determined' in out  # post_ln: one size
  assert 'iso-FLOP group 1: ' in out
  assert 'block=post_ln  L=32  D=32  loss 2.9000 ± n/a (1 seed)' in out
  for name in ('loss_vs_params_fit', 'loss_vs_depth_fit', 'loss_vs_flops', 'isoflop'):
    img = matplotlib.image.imread(tmp_path / 'compare' / f'{name}.png')
    assert img.shape[0] > 100 and np.ptp(img[..., :3]) > 0.1


def test_compare_rejects_a_negative_tolerance(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    compare.main([str(tmp_path), '--isoflop_tolerance=-1'])
  assert e.value.code == 2
  assert '--isoflop_tolerance=-1.0: allowed a number >= 0' in capsys.readouterr().err
