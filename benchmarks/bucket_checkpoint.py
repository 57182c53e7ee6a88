"""Train step time around an asynchronous checkpoint save, to a local directory and to a
bucket on the local GCS server (tests/gcs.py, the test extra's fake-gcs-server): the save
call should cost the device-to-host copy, and the upload should run behind later steps.

For each store: the median of `--steps` steps before the save; a save waited for at once
(its whole time: copy and write or upload); then a second save: the time `Checkpointer.save`
blocks the loop, each of the next `--steps` steps while it finishes in the background, and
how long `Checkpointer.wait` still blocks after them.

  python benchmarks/bucket_checkpoint.py [--shape M] [--steps 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position

from benchmarks import common  # pylint: disable=wrong-import-position
from depthscale import data  # pylint: disable=wrong-import-position
from depthscale.model.transformer import make_model, param_counts  # pylint: disable=wrong-import-position
from depthscale.training.checkpoint import Checkpointer  # pylint: disable=wrong-import-position
from depthscale.training.optim import make_optimizer, schedule  # pylint: disable=wrong-import-position
from depthscale.training.steps import init_state, make_train_step  # pylint: disable=wrong-import-position
from tests.gcs import GcsServer  # pylint: disable=wrong-import-position


def _timed_steps(step, state, batches, n: int):
  """(state, per-step seconds) of n steps, each waited for."""
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    state, out = step(state, next(batches))
    jax.block_until_ready(out['loss'])
    times.append(time.perf_counter() - t0)
  return state, times


def measure(directory: str, cfg, steps: int) -> dict:
  model, tx = make_model(cfg), make_optimizer(cfg)
  state = jax.jit(init_state, static_argnums=(0, 1, 2, 3))(model, tx, 0, cfg.data.seq_len)
  step = jax.jit(make_train_step(model, tx, schedule(cfg)), donate_argnums=0)
  batches = data.train_iterator(cfg.data, 0)
  state, _ = _timed_steps(step, state, batches, 2)  # compile and warm up
  state, before = _timed_steps(step, state, batches, steps)
  ckpt = Checkpointer(directory, keep=2)
  t0 = time.perf_counter()
  ckpt.save(1, state, batches.get_state())
  ckpt.wait()
  alone = time.perf_counter() - t0
  t0 = time.perf_counter()
  ckpt.save(2, state, batches.get_state())
  call = time.perf_counter() - t0
  state, during = _timed_steps(step, state, batches, steps)
  t0 = time.perf_counter()
  ckpt.wait()
  after = time.perf_counter() - t0
  ckpt.close()
  return {'params': param_counts(state['params'])[0], 'before': statistics.median(before),
          'alone': alone, 'call': call, 'during': during, 'after': after}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shape', default='M', choices=sorted(common.SHAPES))
  parser.add_argument('--steps', type=int, default=8)
  args = parser.parse_args()
  cfg = common.nano_config(args.shape, steps=100, log_every=100)
  with tempfile.TemporaryDirectory() as tmp:
    server = GcsServer(os.path.join(tmp, 'objects')).start()
    os.environ.update(server.env)
    try:
      stores = {'local': os.path.join(tmp, 'local', 'ckpt'),
                'bucket': f'gs://{server.bucket()}/ckpt'}
      rows = {name: measure(path, cfg, args.steps) for name, path in stores.items()}
    finally:
      server.stop()
  params = rows['local']['params']
  print(f'shape {args.shape}: {params / 1e6:.1f}M params, checkpoint ~{params * 12 / 2**20:.0f} '
        'MiB (params and two Adam moments, f32)')
  print(f'{"store":<7} {"step":>7} {"save alone":>10} {"save call":>9} {"wait after":>10}  '
        'steps after the save call (ms)')
  for name, r in rows.items():
    print(f'{name:<7} {1e3 * r["before"]:>5.0f}ms {1e3 * r["alone"]:>8.0f}ms '
          f'{1e3 * r["call"]:>7.0f}ms {1e3 * r["after"]:>8.0f}ms  '
          + ' '.join(f'{1e3 * t:.0f}' for t in r['during']))


if __name__ == '__main__':
  main()
