"""Training throughput: depthscale's real trainer (data pipeline, logging steps and all) vs a
minimal PyTorch GPT of the same shape, interleaved A B A B, on configs S, M and D; the ratio's
median and spread over the rounds; MFU against a matmul peak measured in the same run; and
the data pipeline's rate vs the trainer's.

  python benchmarks/throughput.py [--rounds 3] [--steps 21] [--log_every 10] [--configs S,M,D]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # pylint: disable=wrong-import-position

from benchmarks import common  # pylint: disable=wrong-import-position
from benchmarks.torch_gpt import make_trainer  # pylint: disable=wrong-import-position
from depthscale import data  # pylint: disable=wrong-import-position
from depthscale.training.loop import train_rung  # pylint: disable=wrong-import-position


def depthscale_round(name: str, steps: int, log_every: int) -> float:
  """Steady-state tokens/s of one fresh train_rung (compile excluded, as the trainer reports)."""
  cfg = common.nano_config(name, steps, log_every)
  with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
    return train_rung(cfg, workdir, name=name)['tokens_per_sec']


class TorchPeer:
  """The PyTorch GPT of config `name`, fed from the same data pipeline."""

  def __init__(self, name: str):
    d, layers, heads, self.seq_len = common.SHAPES[name]
    self.model, self.step = make_trainer(common.VOCAB, self.seq_len, d, layers, heads, 4 * d)
    self.it = data.train_iterator(common.nano_config(name, 1, 1).data, seed=0)
    for _ in range(2):  # warm-up: allocator and kernel selection
      self._one()

  def _one(self) -> torch.Tensor:
    batch = next(self.it)
    return self.step(torch.from_numpy(batch['inputs']).long(), torch.from_numpy(batch['targets']).long())

  def round(self, steps: int) -> float:
    """Tokens/s over `steps` steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
      loss = self._one()
    loss.item()
    return steps * common.BATCH * self.seq_len / (time.perf_counter() - t0)


def pipeline_rate(name: str, batches: int) -> float:
  """Tokens/s the embedded data pipeline delivers (first batch excluded)."""
  it = data.train_iterator(common.nano_config(name, 1, 1).data, seed=0)
  next(it)
  t0 = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches * common.BATCH * common.SHAPES[name][3] / (time.perf_counter() - t0)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--steps', type=int, default=21, help='steps per depthscale round (>= 2 log intervals)')
  p.add_argument('--log_every', type=int, default=10, help="the trainer's default")
  p.add_argument('--configs', default='S,M,D')
  p.add_argument('--pipeline_batches', type=int, default=200)
  a = p.parse_args()
  torch.set_num_threads(os.cpu_count() or 1)
  print(f'load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores', flush=True)
  peak = {'xla': 0.0, 'torch': 0.0}  # best over the run: re-measured before every round
  results, trainer_rate = {}, {}
  for name in a.configs.split(','):
    peer = TorchPeer(name)
    ours, theirs = [], []
    for r in range(a.rounds):  # A B A B ...
      now = common.matmul_peak()
      peak = {k: max(v, now[k]) for k, v in peak.items()}
      ours.append(depthscale_round(name, a.steps, a.log_every))
      theirs.append(peer.round(a.steps - 1))
      print(f'{name} round {r}: depthscale {ours[-1]:,.0f} tok/s, torch {theirs[-1]:,.0f} tok/s '
            f'(ratio {ours[-1] / theirs[-1]:.2f}; load {os.getloadavg()[0]:.1f})', flush=True)
    results[name] = ours, theirs
    trainer_rate[name] = common.median(ours)
    if name == 'S':  # right after the trainer's S rounds, under the same load
      pipe = pipeline_rate('S', a.pipeline_batches)
  peak_gflops = max(peak.values())
  print(f'\nmatmul peak (float32, model shapes, best of the run): XLA {peak["xla"]:.0f} GFLOP/s, '
        f'torch {peak["torch"]:.0f} GFLOP/s; MFU is against the larger, {peak_gflops:.0f}')
  rows = []
  for name, (ours, theirs) in results.items():
    d, layers, _, seq_len = common.SHAPES[name]
    fpt = common.flops_per_token(d, layers, seq_len)
    o, t = common.median(ours), common.median(theirs)
    ratios = [x / y for x, y in zip(ours, theirs)]
    mfu = lambda tps, fpt=fpt: 100 * tps * fpt / (peak_gflops * 1e9)
    rows.append([name, f'{d}x{layers}', seq_len, f'{fpt / 1e6:.1f}M', o, t, common.median(ratios),
                 f'{min(ratios):.2f}-{max(ratios):.2f}', f'{mfu(o):.0f}%', f'{mfu(t):.0f}%'])
  print(common.FLOPS_RULE + f'; batch {common.BATCH}, vocab {common.VOCAB}; medians of '
        f'{a.rounds} interleaved rounds')
  print(common.table(['config', 'DxL', 'T', 'FLOPs/tok', 'depthscale tok/s', 'torch eager tok/s',
                      'ratio (median)', 'ratio (range)', 'depthscale MFU', 'torch MFU'], rows))
  if 'S' in trainer_rate:
    print(f'\ndata pipeline (source mix, S shape): {pipe:,.0f} tok/s = '
          f'{pipe / trainer_rate["S"]:.1f}x what the trainer consumes on S')
  print(f'load average at end: {os.getloadavg()[0]:.1f}')


if __name__ == '__main__':
  main()
