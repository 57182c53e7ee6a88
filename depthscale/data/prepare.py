"""Converts local text files into ArrayRecord token-chunk shards.

  python -m depthscale.data.prepare --input=GLOB --output=DIR \\
      [--tokenizer=byte|PATH] [--chunk_tokens=N] [--eval_fraction=F]

Writes DIR/train-XXXXX-of-YYYYY.array_record, DIR/eval-*.array_record and
DIR/meta.json. The token stream and its held-out tail are exactly those of
the `text:GLOB` source; each split is cut into records of chunk_tokens tokens
(the remainder is dropped). Read them with `data.source =
'array_record:DIR/train-*.array_record'`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Sequence

from depthscale import atomic
from depthscale.data import shards
from depthscale.data import text
from depthscale.data import tokenizer as tokenizer_lib


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog='python -m depthscale.data.prepare', description=__doc__.split('\n')[0])
  p.add_argument('--input', required=True, help='glob of text files, one document per file')
  p.add_argument('--output', required=True, help='output directory')
  p.add_argument('--tokenizer', default='byte', help="'byte' or a SentencePiece .model path")
  p.add_argument('--chunk_tokens', type=int, default=8192, help='tokens per record')
  p.add_argument('--eval_fraction', type=float, default=0.05, help='held-out tail of the stream')
  p.add_argument('--shard_chunks', type=int, default=1024, help='records per shard file')
  return p


def main(argv: Sequence[str] | None = None) -> dict:
  """Runs the conversion; returns the metadata written to meta.json."""
  args = _parser().parse_args(argv)
  if args.chunk_tokens < 2 or args.shard_chunks < 1 or not 0 < args.eval_fraction < 1:
    raise SystemExit('--chunk_tokens >= 2, --shard_chunks >= 1 and 0 < --eval_fraction < 1 required')
  tok = tokenizer_lib.load(args.tokenizer)
  splits = text.split(text.stream(text.expand(args.input), tok), args.eval_fraction)
  os.makedirs(args.output, exist_ok=True)
  meta = {'vocab_size': tok.vocab_size, 'tokenizer': args.tokenizer, 'eos_id': tok.eos_id,
          'chunk_tokens': args.chunk_tokens, 'dtype': splits[0].dtype.name,
          'eval_fraction': args.eval_fraction}
  for name, tokens in zip(('train', 'eval'), splits):
    n = len(tokens) // args.chunk_tokens
    if not n:
      raise SystemExit(f'the {name} split has {len(tokens)} tokens, fewer than '
                       f'--chunk_tokens={args.chunk_tokens}')
    chunks = tokens[:n * args.chunk_tokens].reshape(n, args.chunk_tokens)
    num_shards = math.ceil(n / args.shard_chunks)
    for i in range(num_shards):
      path = os.path.join(args.output, f'{name}-{i:05d}-of-{num_shards:05d}.array_record')
      shards.write(path, chunks[i * args.shard_chunks:(i + 1) * args.shard_chunks])
    meta[f'{name}_chunks'] = n
  atomic.write_json(os.path.join(args.output, shards.META), meta, indent=2)  # read by every run
  print(json.dumps(meta))
  return meta


if __name__ == '__main__':
  main()
