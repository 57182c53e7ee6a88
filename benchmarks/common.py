"""Shared pieces of the benchmarks: the nanoGPT-shaped configs S, M and D, FLOPs per token,
the matmul peak of this machine, subprocess runs and a table printer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

from depthscale.config import default_config

# name -> (d_model, layers, heads, seq_len); vocab 256, batch 8 for all. D is the deep,
# narrow shape: its 64 layers run as a rolled scan (model.unroll_max_layers)
SHAPES = {'S': (256, 8, 4, 256), 'M': (512, 8, 8, 256), 'D': (128, 64, 2, 128)}
BATCH, VOCAB = 8, 256
FLOPS_RULE = 'FLOPs/token = 6 x non-embedding params + 12 x layers x d_model x seq_len'


def nano_config(name: str, steps: int, log_every: int):
  """depthscale config of the nanoGPT shape: pre-LN, LayerNorm, GELU 4x, learned positions,
  tied embeddings; eval and checkpoint only at the end."""
  d, layers, heads, seq_len = SHAPES[name]
  c = default_config()
  m = c.model
  m.d_model, m.num_layers, m.num_heads, m.vocab_size = d, layers, heads, VOCAB
  m.position, m.norm, m.block, m.mlp, m.tie_embeddings = 'learned', 'layernorm', 'pre_ln', 'gelu', True
  c.data.seq_len, c.data.batch_size, c.data.eval_batches = seq_len, BATCH, 1
  c.train.steps, c.train.log_every = steps, log_every
  c.train.eval_every = c.train.checkpoint_every = steps
  c.optim.warmup_steps = 1
  return c


def non_embedding_params(d: int, layers: int) -> int:
  """Matrices (4 d^2 attention + 8 d^2 MLP) and two LayerNorms per block, plus the final norm."""
  return layers * (12 * d * d + 4 * d) + 2 * d


def flops_per_token(d: int, layers: int, seq_len: int) -> int:
  """6 N (forward + backward of the matmuls) + 12 L D T (attention scores and values)."""
  return 6 * non_embedding_params(d, layers) + 12 * layers * d * seq_len


MATMUL_SHAPES = [(2048, 256, 768), (2048, 256, 1024), (2048, 1024, 256), (2048, 512, 2048),
                 (2048, 2048, 512), (1024, 1024, 1024)]


def _best_rate(fn, flops: float, repeats: int) -> float:
  fn()
  best = min(timed_call(fn) for _ in range(repeats))
  return flops / best / 1e9


def timed_call(fn) -> float:
  """Seconds one call of fn takes."""
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def matmul_peak(repeats: int = 7) -> dict[str, float]:
  """Best GFLOP/s of float32 matmuls at the models' shapes, for XLA (its default dot library
  and the one the train step uses, the better counts) and for torch."""
  import jax  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from depthscale.model import ops  # pylint: disable=import-outside-toplevel
  out = {'xla': 0.0, 'torch': 0.0}
  for m, k, n in MATMUL_SHAPES:
    a, b = np.random.randn(m, k).astype(np.float32), np.random.randn(k, n).astype(np.float32)
    flops = 2.0 * m * k * n
    ja, jb = jax.device_put(a), jax.device_put(b)
    lowered = jax.jit(lambda x, y: x @ y).lower(ja, jb)
    for mm in (lowered.compile(), lowered.compile(ops.compiler_options(ops.platform_of()))):
      out['xla'] = max(out['xla'], _best_rate(lambda mm=mm: mm(ja, jb).block_until_ready(), flops, repeats))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out['torch'] = max(out['torch'], _best_rate(lambda: ta @ tb, flops, repeats))
  return out


def run_json(args: list[str], timeout: float) -> dict:
  """Runs `python -m benchmarks.<...>` in a fresh process; returns the JSON of its last line."""
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join([os.getcwd(), os.environ.get('PYTHONPATH', '')])}
  try:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)
  except subprocess.TimeoutExpired:
    return {'error': f'timeout after {timeout:.0f} s'}
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    return {'error': (proc.stderr.strip().splitlines() or ['?'])[-1]}
  return json.loads(lines[-1])


def table(header: list[str], rows: list[list]) -> str:
  """A plain fixed-width table."""
  cells = [header] + [[f'{v:,.3g}' if isinstance(v, float) and abs(v) < 10 else
                       f'{v:,.0f}' if isinstance(v, float) else str(v) for v in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  fmt = lambda r: '  '.join(c.rjust(w) for c, w in zip(r, widths))
  return '\n'.join([fmt(cells[0]), '  '.join('-' * w for w in widths)] + [fmt(r) for r in cells[1:]])


def median(xs: list[float]) -> float:
  return float(np.median(xs)) if xs else float('nan')
