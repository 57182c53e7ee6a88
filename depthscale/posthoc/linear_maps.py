"""Linear maps across depth (Csordas et al. 2025, "Do Language Models Use Their Depth
Efficiently?", arXiv 2505.13898): how well the residual stream of a shallow model at each
layer predicts a deeper model's at each layer, by relative depth.

  python -m depthscale.posthoc.linear_maps --shallow=RUNG_DIR --deep=RUNG_DIR [--out=FILE.json]

For streams h_l of the shallow model (l = 0..L, h_0 the embedding) and h'_l' of the deep one
(l' = 0..L') on the same tokens, an affine map h'_l' ~ h_l W + b is fit by least squares on
every eval batch but the last and scored on the last by
R^2(l, l') = 1 - sum ||h'_l' - h_l W - b||^2 / sum ||h'_l' - mean(h'_l')||^2 (sums over held-out
tokens and features). The matrix is indexed by relative depth l/L and l'/L'; the paper's
finding is that the best map of each layer lies at the same relative depth. Both rungs must
be finished and share the data config and seed.
"""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from depthscale import data, storage
from depthscale.errors import ConfigError, invalid
from depthscale.model.transformer import make_model
from depthscale.posthoc import init_from
from depthscale.posthoc.streams import residual_streams

_SHALLOW = flags.DEFINE_string('shallow', None, 'Directory of the finished shallow rung.')
_DEEP = flags.DEFINE_string('deep', None, 'Directory of the finished deep rung.')
_OUT = flags.DEFINE_string('out', None, 'Also write the result to this JSON file.')


def streams_of(rung: str, batches: list[dict]) -> jax.Array:
  """h_SxNxD of the rung's final parameters over the batches' tokens (S = L + 1)."""
  cfg = init_from.read_config(rung)
  model = make_model(cfg)
  params = init_from.restore_params(cfg, rung, None)
  run = jax.jit(lambda p, b: residual_streams(model, p, b))
  hs = [run(params, b) for b in batches]
  return jnp.concatenate([h.reshape(h.shape[0], -1, h.shape[-1]) for h in hs], axis=1)


def r2_matrix(x_fit_SxNxD, y_fit_RxNxE, x_test_SxMxD, y_test_RxMxE) -> jax.Array:
  """R^2 (S x R) on the test tokens of the affine least-squares map from x_s to y_r fit on
  the fit tokens (centered by the fit means, so the bias is implicit)."""
  mx, my = x_fit_SxNxD.mean(1, keepdims=True), y_fit_RxNxE.mean(1, keepdims=True)
  r, n, e = y_fit_RxNxE.shape
  y_NxRE = jnp.transpose(y_fit_RxNxE - my, (1, 0, 2)).reshape(n, r * e)
  w_SxDxRE = jax.vmap(lambda x: jnp.linalg.lstsq(x, y_NxRE)[0])(x_fit_SxNxD - mx)
  w_SxRxDxE = jnp.transpose(w_SxDxRE.reshape(w_SxDxRE.shape[:2] + (r, e)), (0, 2, 1, 3))
  pred_SxRxMxE = jnp.einsum('smd,srde->srme', x_test_SxMxD - mx, w_SxRxDxE) + my[None]
  sse = jnp.sum(jnp.square(y_test_RxMxE[None] - pred_SxRxMxE), axis=(2, 3))
  sst = jnp.sum(jnp.square(y_test_RxMxE - y_test_RxMxE.mean(1, keepdims=True)), axis=(1, 2))
  return 1.0 - sse / sst[None]


def fit(shallow: str, deep: str) -> dict:
  """{'shallow_depths': l/L, 'deep_depths': l'/L', 'r2': rows l, columns l',
  'best_deep_depth': per shallow layer the l'/L' of the highest R^2}."""
  cfg, deep_cfg = init_from.read_config(shallow, '--shallow'), init_from.read_config(deep, '--deep')
  if deep_cfg.data.to_dict() != cfg.data.to_dict() or deep_cfg.train.seed != cfg.train.seed:
    raise invalid('--deep', deep, f'a rung with the data config and seed of --shallow={shallow}')
  if cfg.data.eval_batches < 2:
    raise invalid('data.eval_batches', cfg.data.eval_batches, 'at least 2 (fit on all but the '
                  'last, score on the last)')
  batches = data.eval_batches(cfg.data, cfg.train.seed, cfg.data.eval_batches)
  rows = cfg.data.batch_size * (cfg.data.eval_batches - 1) * cfg.data.seq_len
  x, y = streams_of(shallow, batches), streams_of(deep, batches)
  r2 = np.asarray(jax.jit(r2_matrix)(x[:, :rows], y[:, :rows], x[:, rows:], y[:, rows:]),
                  np.float64)
  depths = lambda s: [l / (s - 1) for l in range(s)]
  deep_depths = depths(r2.shape[1])
  return {'shallow': shallow, 'deep': deep, 'shallow_depths': depths(r2.shape[0]),
          'deep_depths': deep_depths, 'r2': r2.tolist(),
          'best_deep_depth': [deep_depths[j] for j in np.argmax(r2, axis=1)]}


def table(result: dict) -> str:
  """The R^2 matrix as text: one row per shallow layer, one column per deep layer."""
  head = "l/L \\ l'/L' " + ' '.join(f'{d:6.2f}' for d in result['deep_depths'])
  lines = [head] + [f'{s:11.2f} ' + ' '.join(f'{v:6.3f}' for v in row) + f'   best {b:.2f}'
                    for s, row, b in zip(result['shallow_depths'], result['r2'],
                                         result['best_deep_depth'])]
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  if len(argv) > 1 or not (_SHALLOW.value and _DEEP.value):
    print('error: usage: --shallow=RUNG_DIR --deep=RUNG_DIR [--out=FILE.json]', file=sys.stderr)
    sys.exit(2)
  logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
  try:
    if _OUT.value:
      storage.check_bucket(_OUT.value, '--out')
    result = fit(_SHALLOW.value, _DEEP.value)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(table(result), flush=True)
  if _OUT.value:
    storage.write_text(_OUT.value, json.dumps(result, indent=2))


if __name__ == '__main__':
  app.run(main)
