"""Plain-text tables comparing the rungs of a ladder."""

from __future__ import annotations

COLUMNS = (('rung', '{}'), ('L', '{}'), ('D', '{}'), ('non_emb_params', '{:,}'),
           ('train_loss', '{:.4f}'), ('eval_loss', '{:.4f}'), ('tokens/s', '{:,.0f}'),
           ('compile_s', '{:.1f}'))


def rung_row(name: str, cfg, summary: dict) -> dict:
  """The table row of one finished rung."""
  return {'rung': name, 'L': cfg.model.num_layers, 'D': cfg.model.d_model,
          'non_emb_params': summary['non_embedding_params'],
          'train_loss': summary['final_train_loss'], 'eval_loss': summary['final_eval_loss'],
          'tokens/s': summary['tokens_per_sec'], 'compile_s': summary['compile_s']}


def table(rows: list[dict], columns=COLUMNS) -> str:
  """Aligned text table of rows (missing values shown as '-')."""
  cells = [[c for c, _ in columns]]
  for r in rows:
    cells.append([fmt.format(r[c]) if r.get(c) is not None else '-' for c, fmt in columns])
  widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
  lines = ['  '.join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(row, widths)))
           for row in cells]
  return '\n'.join([lines[0], '-' * len(lines[0]), *lines[1:]])
