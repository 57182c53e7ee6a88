"""Compare the rungs of a ladder: python -m depthscale.compare DIR [--out=DIR/compare].

Prints the rung table (final eval loss, params, tokens/s, effective depths) and writes
loss_vs_depth.png (final eval loss vs L, one line per variant) and profiles.png
(per-layer metrics at the final step vs l/L, one line per rung), and the same figures as
TensorBoard images `ladder/<name>` in an event file next to them (by default in DIR/compare:
the run `compare` of `tensorboard --logdir DIR`).
"""

from __future__ import annotations

import argparse
import sys

import ml_collections
import pandas as pd

from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.results import plots
from depthscale.results.loader import Results, load
from depthscale.results.report import COLUMNS, rung_row, table
from depthscale.training.writers import TensorBoard

DEPTH_FIELDS = ('model.num_layers', 'model.d_model', 'model.num_heads', 'model.d_ff',
                'model.mlp_ratio')  # what a depth or width-depth sweep varies
ED_COLUMNS = (('params', '{:,}'), ('ed_cos', '{:g}'), ('ed_kl', '{:g}'), ('ed_skip', '{:g}'),
              ('ed_skip/L', '{:.2f}'))


def variant_labels(configs: pd.DataFrame) -> dict[str, str]:
  """Rung -> variant: the config fields that differ across rungs, depth and width excluded."""
  varying = [c for c in configs.columns if c != 'rung' and c not in DEPTH_FIELDS
             and configs[c].astype(str).nunique() > 1]
  return {row.rung: ','.join(f'{c.split(".")[-1]}={row[c]}' for c in varying) or 'all'
          for _, row in configs.iterrows()}


def rows(res: Results) -> list[dict]:
  """Table rows of the finished rungs: the report columns plus params and effective depths."""
  out = []
  configs = res.configs.set_index('rung')
  for _, s in res.summaries.iterrows():
    cfg = ml_collections.ConfigDict({'model': {'num_layers': configs.loc[s.rung, 'model.num_layers'],
                                               'd_model': configs.loc[s.rung, 'model.d_model']}})
    row = rung_row(s.rung, cfg, s.to_dict())
    row['params'] = s['params']
    for kind in ('cos', 'kl', 'skip'):
      row[f'ed_{kind}'] = s.get(f'final_effective_depth_{kind}')
    row['ed_skip/L'] = s.get('final_effective_depth_skip_ratio')
    out.append(row)
  return out


def tensorboard_images(logdir: str, pngs: list[str]) -> str:
  """Writes the PNG files as TensorBoard images `ladder/<file name>` at step 0 to a new event
  file in logdir, whose START at step 0 hides the images of an earlier call; its path."""
  tb = TensorBoard(logdir)
  for path in pngs:
    tb.image(0, f'ladder/{storage.name(path).removesuffix(".png")}', storage.read_bytes(path))
  tb.close()
  return tb.path


def compare(ladder_dir: str, out_dir: str | None = None) -> tuple[str, list[str]]:
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
  return table(rows(res), COLUMNS + ED_COLUMNS), paths + [tensorboard_images(out_dir, paths)]


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog='python -m depthscale.compare', description=__doc__.splitlines()[0])
  parser.add_argument('ladder_dir', help='a ladder directory (one subdirectory per rung)')
  parser.add_argument('--out', default=None,
                      help='where the PNGs and their event file go (default LADDER_DIR/compare)')
  args = parser.parse_args(argv)
  try:
    storage.check_bucket(args.ladder_dir, 'ladder_dir')
    storage.check_bucket(args.out or '', '--out')
  except ConfigError as e:
    parser.exit(2, f'error: {e}\n')
  if not storage.isdir(args.ladder_dir):
    parser.exit(2, f'error: ladder_dir={args.ladder_dir!r} is not a directory\n')
  text, paths = compare(args.ladder_dir, args.out)
  print(text)
  for p in paths:
    print('wrote', p)
  sys.stdout.flush()


if __name__ == '__main__':
  main()
