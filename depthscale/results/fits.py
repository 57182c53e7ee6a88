"""Power-law fits of final loss against a size x (non-embedding parameters, depth).

Two forms, both fitted by least squares on log loss (as Hoffmann et al. 2022,
arXiv:2203.15556, fit log L; without their Huber loss): the saturating law L = E + A x^-alpha
(E the irreducible loss) and the plain law L = A x^-alpha of Kaplan et al. 2020
(arXiv:2001.08361), a straight line in log-log. Rungs sharing an x are one point (their
seeds); the fit goes through the points' mean losses. 95% intervals: percentiles of a
bootstrap over seeds (each point's seeds resampled, the fit repeated) when every point has
>= 2 seeds, otherwise the fit's covariance s^2 (J^T J)^-1 with Student-t quantiles on n - p
degrees of freedom.

Order: fewer than 3 distinct x, or x spanning less than a factor MIN_SPAN: not determined.
The plain law is fitted; if its alpha interval holds 0 the curve is flat: not determined.
With >= 4 points the saturating law replaces it when E is identified: the fit is off its
bounds (0 <= E < lowest loss, 0 < alpha < ALPHA_MAX), beats the plain law in the
extra-sum-of-squares F test at 5%, and the interval of E lies inside (0, lowest loss);
otherwise the plain law stays, with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize, stats

SATURATING = 'E + A x^-alpha'
PLAIN = 'A x^-alpha'
LEVEL = 0.95  # interval coverage
RESAMPLES = 500  # bootstrap replicates
ALPHA_MAX = 10.0  # the saturating fit's bound on alpha (alpha >= 0)
MIN_SPAN = 2.0  # largest / smallest x below which a curve is no size scaling (a budget sweep)
_PARAMS = {SATURATING: ('E', 'A', 'alpha'), PLAIN: ('A', 'alpha')}


@dataclasses.dataclass
class Fit:
  """A fit of one curve: its points, the fitted form (None: not determined) and why."""
  label: str
  x: np.ndarray  # distinct sizes, ascending
  mean: np.ndarray  # mean loss per point
  std: np.ndarray  # std over seeds per point (ddof 1; NaN with one seed)
  seeds: np.ndarray  # rungs per point
  form: str | None = None
  params: dict[str, float] = dataclasses.field(default_factory=dict)
  intervals: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
  method: str = ''
  notes: list[str] = dataclasses.field(default_factory=list)

  @property
  def determined(self) -> bool:
    return self.form is not None

  def predict(self, x) -> np.ndarray:
    """The fitted loss at sizes x."""
    p = self.params
    return p.get('E', 0.0) + p['A'] * np.asarray(x, float) ** -p['alpha']

  def describe(self) -> str:
    """One line (plus notes): the form, each parameter with its interval, the method."""
    if not self.determined:
      return f'{self.label}: not determined: ' + '; '.join(self.notes)
    vals = ', '.join(f'{k} = {v:.4g} [{self.intervals[k][0]:.4g}, {self.intervals[k][1]:.4g}]'
                     for k, v in self.params.items())
    notes = ''.join(f'\n    ({n})' for n in self.notes)
    return f'{self.label}: loss = {self.form}: {vals} ({self.method}){notes}'


def _log_model(form: str, theta: np.ndarray, u: np.ndarray) -> np.ndarray:
  """log loss at u = log(x / x0); theta = (c, alpha) or (E, c, alpha), A x0^-alpha = e^c."""
  if form == PLAIN:
    return theta[0] - theta[1] * u
  return np.log(theta[0] + np.exp(theta[1] - theta[2] * u))


def _log_model_jac(form: str, theta: np.ndarray, u: np.ndarray) -> np.ndarray:
  """d log loss / d theta, one row per point."""
  if form == PLAIN:
    return np.stack([np.ones_like(u), -u], axis=1)
  g = np.exp(theta[1] - theta[2] * u)
  m = theta[0] + g
  return np.stack([1 / m, g / m, -u * g / m], axis=1)


def _start(form: str, u: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Initial theta: the log-log line, and for the saturating form the best of a grid of E."""
  line = lambda e: np.polyfit(u, np.log(y - e), 1)[::-1] * [1, -1]
  if form == PLAIN:
    return line(0.0)
  cands = [np.array([e, *line(e)]) for e in np.linspace(0, 0.95, 20) * y.min()]
  cands = [np.array([t[0], t[1], np.clip(t[2], 1e-3, ALPHA_MAX - 1e-3)]) for t in cands]
  return min(cands, key=lambda t: np.sum((_log_model(form, t, u) - np.log(y)) ** 2))


def _solve(form: str, u: np.ndarray, y: np.ndarray, theta0: np.ndarray, tol: float = 1e-14):
  """scipy least squares on log loss; the result (x, jac, fun)."""
  if form == PLAIN:
    bounds = (-np.inf, np.inf)
  else:
    bounds = ([0.0, -np.inf, 0.0], [y.min() * (1 - 1e-9), np.inf, ALPHA_MAX])
    theta0 = np.clip(theta0, *bounds)
  res = lambda t: _log_model(form, t, u) - np.log(y)
  return optimize.least_squares(res, theta0, lambda t: _log_model_jac(form, t, u), bounds=bounds,
                                method='trf', x_scale='jac',
                                xtol=tol, ftol=tol, gtol=tol)


def _natural(form: str, theta: np.ndarray, log_x0: float) -> np.ndarray:
  """theta -> (E,) A, alpha."""
  *e, c, alpha = theta
  return np.array([*e, np.exp(c + alpha * log_x0), alpha])


def _at_bound(theta: np.ndarray, y_min: float) -> str:
  """Why the saturating fit sits on a bound ('' if it does not)."""
  e, _, alpha = theta
  if e <= 1e-6 * y_min:
    return 'E fits at 0: the curve shows no floor'
  if e >= y_min * (1 - 1e-6):
    return 'E fits at the lowest loss'
  if alpha <= 1e-6 or alpha >= ALPHA_MAX * (1 - 1e-6):
    return f'alpha fits at its bound ({alpha:.3g})'
  return ''


def _covariance_intervals(form: str, sol, log_x0: float) -> dict[str, tuple[float, float]] | str:
  """Intervals from s^2 (J^T J)^-1 (t quantiles, n - p dof); a reason string if singular.
  A's interval is exp(log A +- t se), log A = c + alpha log x0."""
  n, p = sol.jac.shape
  jtj = sol.jac.T @ sol.jac
  if np.linalg.matrix_rank(jtj) < p:
    return 'the fit\'s covariance is singular'
  cov = np.sum(sol.fun ** 2) / (n - p) * np.linalg.inv(jtj)
  to_log = np.eye(p)  # rows: (E,) log A, alpha as linear maps of theta
  to_log[-2, -1] = log_x0
  se = np.sqrt(np.maximum(np.diag(to_log @ cov @ to_log.T), 0))
  t = stats.t.ppf(0.5 + LEVEL / 2, n - p)
  mid = to_log @ sol.x
  lo, hi = mid - t * se, mid + t * se
  with np.errstate(over='ignore'):
    lo[-2], hi[-2] = np.exp(lo[-2]), np.exp(hi[-2])
  return {k: (float(a), float(b)) for k, a, b in zip(_PARAMS[form], lo, hi)}


def _bootstrap_intervals(form: str, u, groups, theta, log_x0,
                         seed: int) -> dict[str, tuple[float, float]]:
  """Percentile intervals of the parameters refitted on seeds resampled within each point.
  Resampled deviations from the point's mean are scaled by sqrt(k / (k - 1)) (k seeds), so a
  resampled mean has the variance s^2 / k (the modified residuals of Davison & Hinkley 1997,
  Bootstrap Methods and their Application, with leverage 1 / k)."""
  rng = np.random.default_rng(seed)
  dev = [(g - g.mean()) * np.sqrt(g.size / (g.size - 1)) for g in groups]
  means = np.array([g.mean() for g in groups])
  reps = []
  for _ in range(RESAMPLES):
    y = means + np.array([rng.choice(d, d.size).mean() for d in dev])
    reps.append(_natural(form, _solve(form, u, y, theta, 1e-8).x, log_x0))
  q = np.percentile(np.array(reps), [50 - LEVEL * 50, 50 + LEVEL * 50], axis=0)
  return {k: (float(a), float(b)) for k, a, b in zip(_PARAMS[form], *q)}


def _no_floor(fit: Fit, sol) -> str:
  """Why the saturating fit does not improve on the plain one held in `fit` ('' if it does):
  the extra-sum-of-squares F test of the nested models at 1 - LEVEL."""
  ssr_plain = np.sum((np.log(fit.predict(fit.x)) - np.log(fit.mean)) ** 2)
  ssr, dof = np.sum(sol.fun ** 2), fit.x.size - 3
  with np.errstate(divide='ignore', invalid='ignore'):
    p = stats.f.sf((ssr_plain - ssr) / (ssr / dof), 1, dof) if ssr > 0 else 0.0
  return f'E does not improve the plain fit: F test p = {p:.2g}' if p > 1 - LEVEL else ''


def _estimate(fit: Fit, form: str, groups: list[np.ndarray], seed: int) -> str:
  """Fits `form` into `fit`; '' on success, else why it is not identified."""
  log_x0 = float(np.mean(np.log(fit.x)))
  u = np.log(fit.x) - log_x0
  sol = _solve(form, u, fit.mean, _start(form, u, fit.mean))
  if form == SATURATING and (why := _at_bound(sol.x, fit.mean.min()) or _no_floor(fit, sol)):
    return why
  if min(fit.seeds) >= 2:
    intervals = _bootstrap_intervals(form, u, groups, sol.x, log_x0, seed)
    method = f'{LEVEL:.0%} bootstrap over seeds, {RESAMPLES} resamples'
  else:
    intervals = _covariance_intervals(form, sol, log_x0)
    method = f'{LEVEL:.0%} from the fit\'s covariance, t on {len(fit.x) - sol.x.size} dof'
    if isinstance(intervals, str):
      return intervals
  if form == SATURATING:
    lo, hi = intervals['E']
    if lo <= 1e-6 * fit.mean.min() or hi >= fit.mean.min() * (1 - 1e-6):
      return f'the interval of E [{lo:.4g}, {hi:.4g}] reaches 0 or the lowest loss'
  fit.form, fit.method, fit.intervals = form, method, intervals
  fit.params = dict(zip(_PARAMS[form], map(float, _natural(form, sol.x, log_x0))))
  return ''


def fit_power_law(x, loss, label: str = '', seed: int = 0) -> Fit:
  """Fits loss(x) over rungs (rungs with equal x are seeds of one point): the saturating law
  if E is identified, else the plain law; not determined (with the reason) otherwise."""
  x, loss = np.asarray(x, float), np.asarray(loss, float)
  keep = np.isfinite(x) & np.isfinite(loss) & (x > 0) & (loss > 0)
  xs = np.unique(x[keep])
  groups = [loss[keep][x[keep] == v] for v in xs]
  fit = Fit(label, xs, np.array([g.mean() for g in groups]),
            np.array([g.std(ddof=1) if g.size > 1 else np.nan for g in groups]),
            np.array([g.size for g in groups]))
  if not keep.all():
    fit.notes.append(f'{np.sum(~keep)} rungs without a finite positive loss left out')
  if xs.size < 3:
    fit.notes.append(f'too few points: {xs.size} distinct x (the plain power law needs 3, '
                     'the saturating one 4)')
    return fit
  if xs[-1] / xs[0] < MIN_SPAN:
    fit.notes.append(f'x spans a factor of {xs[-1] / xs[0]:.3g} only (at least {MIN_SPAN:g} '
                     'needed): equal-size rungs, compare them at equal FLOPs instead')
    return fit
  if why := _estimate(fit, PLAIN, groups, seed):
    fit.notes.append(why)
    return fit
  lo, hi = fit.intervals['alpha']
  if lo <= 0 <= hi:
    fit.notes.append(f'flat curve: the exponent alpha = {fit.params["alpha"]:.3g} '
                     f'[{lo:.3g}, {hi:.3g}] is not distinguishable from 0')
    fit.form = None
  elif xs.size < 4:
    fit.notes.append('3 points: E not fitted, plain power law')
  elif why := _estimate(fit, SATURATING, groups, seed):
    fit.notes.append(f'E not identified ({why}): fell back to the plain power law')
  return fit
