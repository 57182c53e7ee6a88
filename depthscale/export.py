"""A rung's latest checkpoint as a Hugging Face checkpoint (GPT-2 or Llama), for the tools
that read that format (lm-evaluation-harness, transformers):

  python -m depthscale.export RUNG_DIR --out=DIR [--dtype=float32|bfloat16]

DIR gets config.json, model.safetensors and, when the rung's data.tokenizer is a
tokenizer file, its tokenizer files. A rung whose model is neither a GPT-2 (Pre-LN,
LayerNorm, learned positions, GELU) nor a Llama (Pre-LN, RMSNorm, RoPE, SwiGLU) is refused
in one line naming the field that does not map (exit code 2), before anything is written;
so is a DIR that holds files already.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from depthscale import hf, storage
from depthscale.errors import ConfigError, invalid
from depthscale.hf import architectures
from depthscale.posthoc import init_from

def export(rung: str, out: str, dtype: str = 'float32') -> str:
  """Writes the rung's latest checkpoint to out; returns the architecture written."""
  cfg = init_from.read_config(rung, 'RUNG_DIR', finished=False)
  family = architectures.export_family(cfg)
  if storage.is_url(out):
    raise invalid('--out', out, 'a local directory')
  if storage.isdir(out) and storage.listdir(out):
    raise invalid('--out', out, 'a new or empty directory (nothing is overwritten)')
  if not storage.exists(storage.join(rung, 'checkpoints')):
    raise invalid('RUNG_DIR', rung, 'a rung with a checkpoint')
  hf.save(cfg, init_from.restore_params(cfg, rung, None), out, dtype)
  return family


def main(argv: list[str]) -> None:
  out, dtype = flags.FLAGS.out, flags.FLAGS.dtype
  if len(argv) != 2 or not out:
    print('error: usage: python -m depthscale.export RUNG_DIR --out=DIR', file=sys.stderr)
    sys.exit(2)
  logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
  try:
    family = export(argv[1], out, dtype)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(f'wrote {argv[1]} as a {family} checkpoint to {out}', flush=True)


if __name__ == '__main__':  # flags defined here: importing the module defines none
  flags.DEFINE_string('out', None, 'Directory to write the Hugging Face checkpoint to.')
  flags.DEFINE_string('dtype', 'float32', 'Tensor dtype: float32 or bfloat16.')
  app.run(main)
