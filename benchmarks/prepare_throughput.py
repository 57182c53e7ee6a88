"""Corpus preparation speed per tokenizer: byte, SentencePiece and Hugging Face tokenizers.

  python benchmarks/prepare_throughput.py [--repeat=8] [--vocab=8192] [--workers=1,2]

Trains a BPE `tokenizers` model and a unigram SentencePiece model (both --vocab) on the
python_docs corpus (nothing downloaded), writes python_docs --repeat times as one
JSONL.zst file per copy, then measures (1) the tokenizer alone on one core (encode_batch
over the documents: tokens per CPU second) and (2) `python -m depthscale.data.prepare`
end to end (read, decompress, hash split, tokenize, write shards) with each --workers
value, as tokens per wall second and per CPU second of the prepare processes. The last
column is the CPU time a 100B-token corpus would take: core-hours = 1e11 / (tokens per
CPU second) / 3600.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import sentencepiece as spm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
import zstandard

from depthscale.data import python_docs
from depthscale.data import tokenizer as tokenizer_lib

CORPUS_TOKENS = 100e9


def train_tokenizers(docs: list[str], vocab: int, root: str) -> dict[str, str]:
  """The three tokenizer specs: byte, a SentencePiece .model and a tokenizer.json."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(docs), model_writer=model,
                                 vocab_size=vocab, model_type='unigram',
                                 max_sentence_length=1 << 20, num_threads=2)
  sp_path = os.path.join(root, 'sp.model')
  with open(sp_path, 'wb') as f:
    f.write(model.getvalue())
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(docs, trainers.BpeTrainer(
      vocab_size=vocab, special_tokens=['<|endoftext|>'],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf_path = os.path.join(root, 'tokenizer.json')
  tok.save(hf_path)
  return {'byte': 'byte', 'sentencepiece': sp_path, 'tokenizers': hf_path}


def encode_rate(spec: str, docs: list[bytes]) -> tuple[float, float]:
  """(tokens per CPU second, bytes per token) of encode_batch on this process (one core)."""
  os.environ['TOKENIZERS_PARALLELISM'] = 'false'
  tok = tokenizer_lib.load(spec)
  tokens, t0 = 0, time.process_time()
  for i in range(0, len(docs), 256):
    tokens += sum(len(ids) for ids in tok.encode_batch(docs[i:i + 256]))
  return tokens / (time.process_time() - t0), sum(map(len, docs)) / tokens


def prepare_rate(spec: str, pattern: str, out: str, workers: int) -> tuple[float, float, int]:
  """(tokens per wall second, tokens per CPU second, tokens) of one prepare run."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  res = subprocess.run([sys.executable, '-m', 'depthscale.data.prepare', f'--input={pattern}',
                        f'--output={out}', f'--tokenizer={spec}', f'--workers={workers}',
                        '--progress_every=1000'], capture_output=True, text=True, check=True)
  wall = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  meta = json.loads(res.stdout.strip().splitlines()[-1])
  tokens = meta['train_tokens'] + meta['eval_tokens']
  return tokens / wall, tokens / cpu, tokens


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument('--repeat', type=int, default=8, help='copies of python_docs in the corpus')
  p.add_argument('--vocab', type=int, default=8192)
  p.add_argument('--workers', default='1,2')
  args = p.parse_args()
  docs = list(python_docs.documents())
  root = tempfile.mkdtemp(prefix='prepare-bench-')
  t0 = time.perf_counter()
  specs = train_tokenizers([d.decode() for d in docs], args.vocab, root)
  print(f'tokenizers trained on python_docs ({len(docs)} documents) in '
        f'{time.perf_counter() - t0:.1f} s; load {os.getloadavg()[0]:.1f}')
  data_dir = os.path.join(root, 'corpus')
  os.makedirs(data_dir)
  lines = b''.join(json.dumps({'text': d.decode()}).encode() + b'\n' for d in docs)
  for i in range(args.repeat):
    with open(os.path.join(data_dir, f'part-{i:03d}.jsonl.zst'), 'wb') as f:
      f.write(zstandard.ZstdCompressor().compress(lines))
  mb = args.repeat * sum(map(len, docs)) / 1e6
  print(f'corpus: {args.repeat} x python_docs = {mb:.1f} MB of text as JSONL.zst files')
  workers = [int(w) for w in args.workers.split(',')]
  head = ['tokenizer', 'vocab', 'bytes/token', 'encode tok/CPU-s']
  head += [f'prepare w={w} tok/s, tok/CPU-s' for w in workers] + ['core-hours per 100B tokens']
  print(' | '.join(head))
  for name, spec in specs.items():
    rate, bpt = encode_rate(spec, docs)
    row = [name, str(tokenizer_lib.load(spec).vocab_size), f'{bpt:.2f}', f'{rate:,.0f}']
    cpu_rates = []
    for w in workers:
      wall, cpu, _ = prepare_rate(spec, os.path.join(data_dir, '*.jsonl.zst'),
                                  os.path.join(root, f'out-{name}-{w}'), w)
      row.append(f'{wall:,.0f}, {cpu:,.0f}')
      cpu_rates.append(cpu)
    row.append(f'{CORPUS_TOKENS / max(cpu_rates) / 3600:,.0f} (prepare), '
               f'{CORPUS_TOKENS / rate / 3600:,.0f} (encode only)')
    print(' | '.join(row), flush=True)
  print(f'load after: {os.getloadavg()[0]:.1f}; files in {root}')


if __name__ == '__main__':
  main()
