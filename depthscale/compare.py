"""Compare the rungs of a ladder: python -m depthscale.compare DIR [--out=DIR/compare].

Prints the rung table (final eval loss, params, training FLOPs, tokens/s, effective depths)
and writes loss_vs_depth.png (final eval loss vs L, one line per variant) and profiles.png
(per-layer metrics at the final step vs l/L, one line per rung); then the power-law fits of
final eval loss per variant with their intervals (loss_vs_params_fit.png,
loss_vs_depth_fit.png), loss vs training FLOPs (loss_vs_flops.png) and the iso-FLOP groups
(isoflop.png): docs/metrics.md. A learning-rate sweep (ladder.lr_sweep) adds loss_vs_lr.png (final eval loss vs
rate per variant, seeds as points, the chosen rate ringed) and each variant's
best rate, its seed count, mean final eval loss with a 95% Student-t interval, and the
ranking (two variants ordered only where their intervals separate). All of these figures also go as TensorBoard images
`ladder/<name>` to an event file next to them (by default in DIR/compare: the run `compare`
of `tensorboard --logdir DIR`).
"""

from __future__ import annotations

import argparse
import sys

import ml_collections
import numpy as np

from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.results import intervals, plots, scaling
from depthscale.results.fits import LEVEL
from depthscale.results.flops import ISOFLOP_TOLERANCE
from depthscale.results.loader import Results, load
from depthscale.results.report import COLUMNS, rung_row, table
from depthscale.results.scaling import variant_labels
from depthscale.training.writers import TensorBoard

ED_COLUMNS = (('params', '{:,}'), ('ed_cos', '{:g}'), ('ed_kl', '{:g}'), ('ed_skip', '{:g}'),
              ('ed_skip/L', '{:.2f}'))
FLOPS_COLUMNS = (('flops', '{:.3g}'),)


def rows(res: Results) -> list[dict]:
  """Table rows of the finished rungs: the report columns plus params and effective depths."""
  out = []
  configs = res.configs.set_index('rung')
  for _, s in res.summaries.iterrows():
    cfg = ml_collections.ConfigDict({'model': {'num_layers': configs.loc[s.rung, 'model.num_layers'],
                                               'd_model': configs.loc[s.rung, 'model.d_model']}})
    row = rung_row(s.rung, cfg, s.to_dict())
    row['params'] = s['params']
    row['flops'] = s['flops']
    for kind in ('cos', 'kl', 'skip'):
      row[f'ed_{kind}'] = s.get(f'final_effective_depth_{kind}')
    row['ed_skip/L'] = s.get('final_effective_depth_skip_ratio')
    out.append(row)
  return out


PAIRWISE_MAX = 6  # variants up to which every pair's order is listed (15 pairs)
SWEEP_COLUMNS = (('variant', '{}'), ('lr', '{:g}'), ('rates', '{}'), ('edge', '{}'), ('seeds', '{}'),
                 ('mean', '{:.4f}'), ('low', '{:.4f}'), ('high', '{:.4f}'), ('rank', '{}'))


def sweep_view(res: Results) -> str:
  """Text of a learning-rate sweep: per variant its best rate, seeds, mean final eval loss
  and interval, rank; then the pairwise ranking where there are at most PAIRWISE_MAX
  variants (the rank column says the same for more). '' for a ladder without a sweep."""
  sweep = res.sweep()
  if sweep.empty:
    return ''
  head = (f'learning-rate sweep: each variant at its best rate, final eval loss over seeds '
          f'({intervals.LEVEL:.0%} Student-t interval; ranked only where intervals separate):')
  pairs = (intervals.ranking(sweep) or ['one variant'] if len(sweep) <= PAIRWISE_MAX else
           [f'{len(sweep)} variants: each one\'s rank is 1 + the variants whose interval lies wholly below its own'])
  return '\n'.join([head, table(sweep.to_dict('records'), SWEEP_COLUMNS), 'ranking: ' + '; '.join(pairs)])


def tensorboard_images(logdir: str, pngs: list[str]) -> str:
  """Writes the PNG files as TensorBoard images `ladder/<file name>` at step 0 to a new event
  file in logdir, whose START at step 0 hides the images of an earlier call; its path."""
  tb = TensorBoard(logdir)
  for path in pngs:
    tb.image(0, f'ladder/{storage.name(path).removesuffix(".png")}', storage.read_bytes(path))
  tb.close()
  return tb.path


def scaling_views(res: Results, out_dir: str,
                  tolerance: float = ISOFLOP_TOLERANCE) -> tuple[str, list[str]]:
  """(text, written PNG paths) of the power-law fits, loss vs training FLOPs and the iso-FLOP
  groups of a loaded ladder."""
  pts, lines, paths = res.points(), [], []
  for against in scaling.AGAINST:
    fits = scaling.fit(pts, against)
    single = [f for f in fits if f.x.size == 1]  # a sweep's variants: nothing to fit, said once
    lines += [f'fits of final eval loss vs {against} ({LEVEL:.0%} intervals):']
    lines += ['  ' + f.describe().replace('\n', '\n  ') for f in fits if f.x.size > 1]
    if single:
      lines.append(f'  {len(single)} variant{"s" if len(single) > 1 else ""} with one {against} '
                   'each: not determined (the plain power law needs 3 distinct sizes)')
    paths.append(storage.join(out_dir, f'loss_vs_{against}_fit.png'))
    _, name, base = scaling.AGAINST[against]
    plots.save(plots.fits_figure(fits, name, f'loss vs {against}', base), paths[-1])
  paths.append(storage.join(out_dir, 'loss_vs_flops.png'))
  plots.save(plots.loss_vs_flops_figure(
      {v: (g.flops.tolist(), g.loss.tolist()) for v, g in pts.groupby('variant')}), paths[-1])
  groups = scaling.isoflop(pts, tolerance)
  if not groups:
    lines.append(f'iso-FLOP: no rungs of different depths at equal training FLOPs '
                 f'(within {tolerance:.0%})')
    return '\n'.join(lines), paths
  panels = []
  for i, g in enumerate(groups, 1):
    title = f'{g.flops.min():.3g}-{g.flops.max():.3g} FLOPs'
    lines.append(f'iso-FLOP group {i}: {title} (spread {g.flops.max() / g.flops.min() - 1:.0%}):')
    curves: dict[str, tuple[list, list, list]] = {}
    for (v, l, d), h in g.groupby(['variant', 'L', 'D'], sort=True):
      std = h.loss.std(ddof=1) if len(h) > 1 else np.nan
      spread = f'{std:.2g}' if len(h) > 1 else 'n/a'
      lines.append(f'  {v}  L={l}  D={d}  loss {h.loss.mean():.4f} ± {spread} '
                   f'({len(h)} seed{"s" * (len(h) > 1)})')
      for c, value in zip(curves.setdefault(v, ([], [], [])), (l, h.loss.mean(), std)):
        c.append(value)
    panels.append((title, curves))
  paths.append(storage.join(out_dir, 'isoflop.png'))
  plots.save(plots.isoflop_figure(panels), paths[-1])
  return '\n'.join(lines), paths


def compare(ladder_dir: str, out_dir: str | None = None,
            tolerance: float = ISOFLOP_TOLERANCE) -> tuple[str, list[str]]:
  """(table text, written paths: the PNGs, then their TensorBoard event file) for a ladder
  directory."""
  res = load(ladder_dir)
  if res.summaries.empty:
    raise SystemExit(f'error: {ladder_dir} has no finished rung (no */summary.json)')
  out_dir = out_dir or storage.join(ladder_dir, 'compare')
  storage.makedirs(out_dir)
  labels = variant_labels(res.configs)
  depth = res.configs.set_index('rung')['model.num_layers']
  curves: dict[str, tuple[list[int], list[float]]] = {}
  for _, s in res.summaries.iterrows():
    depths, losses = curves.setdefault(labels[s.rung], ([], []))
    depths.append(int(depth[s.rung]))
    losses.append(float(s['final_eval_loss']))
  paths = [storage.join(out_dir, 'loss_vs_depth.png'), storage.join(out_dir, 'profiles.png')]
  plots.loss_vs_depth(curves, paths[0])
  plots.final_profiles({r: res.final_profile(r) for r in res.summaries.rung}, paths[1])
  views, more = scaling_views(res, out_dir, tolerance)
  sweep = res.sweep()
  if not sweep.empty:
    more.append(storage.join(out_dir, 'loss_vs_lr.png'))
    plots.save(plots.loss_vs_lr_figure(res.rate_points(), dict(zip(sweep.variant, sweep.lr))), more[-1])
  text = '\n\n'.join(filter(None, [table(rows(res), COLUMNS + ED_COLUMNS + FLOPS_COLUMNS),
                                  sweep_view(res), views]))
  return text, paths + more + [tensorboard_images(out_dir, paths + more)]


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog='python -m depthscale.compare', description=__doc__.splitlines()[0])
  parser.add_argument('ladder_dir', help='a ladder directory (one subdirectory per rung)')
  parser.add_argument('--out', default=None,
                      help='where the PNGs and their event file go (default LADDER_DIR/compare)')
  parser.add_argument('--isoflop_tolerance', type=float, default=ISOFLOP_TOLERANCE,
                      help='rungs whose training FLOPs agree within this fraction are compared '
                           'at equal compute (default %(default)s)')
  args = parser.parse_args(argv)
  try:
    storage.check_bucket(args.ladder_dir, 'ladder_dir')
    storage.check_bucket(args.out or '', '--out')
  except ConfigError as e:
    parser.exit(2, f'error: {e}\n')
  if not args.isoflop_tolerance >= 0:
    parser.exit(2, f'error: --isoflop_tolerance={args.isoflop_tolerance}: allowed a number >= 0\n')
  if not storage.isdir(args.ladder_dir):
    parser.exit(2, f'error: ladder_dir={args.ladder_dir!r} is not a directory\n')
  text, paths = compare(args.ladder_dir, args.out, args.isoflop_tolerance)
  print(text)
  for p in paths:
    print('wrote', p)
  sys.stdout.flush()


if __name__ == '__main__':
  main()
