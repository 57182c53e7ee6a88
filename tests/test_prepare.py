"""Corpus dumps to shards: every input format, the three tokenizers, two workers, resume,
the trainer on the shards (bitwise resume, document masking), and python_docs."""

import glob
import gzip
import hashlib
import io
import json
import os
import random

from array_record.python.array_record_module import ArrayRecordReader
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from depthscale import config as config_lib
from depthscale import data, storage
from depthscale.data import documents
from depthscale.data import prepare
from depthscale.data import python_docs
from depthscale.data import vocab
from depthscale.data import tokenizer as tokenizer_lib
from depthscale.model.transformer import make_model
from depthscale.storage import read_jsonl
from depthscale.training.loop import train_rung
from tests.helpers import tiny_config

EOS = '<|endoftext|>'


def make_docs(n: int, seed: int) -> list[str]:
  rng = random.Random(seed)
  words = [''.join(rng.choice('abcdefghij') for _ in range(rng.randint(2, 8))) for _ in range(200)]
  return [' '.join(rng.choice(words) for _ in range(rng.randint(10, 120))) for _ in range(n)]


def jsonl(docs: list[str]) -> bytes:
  return ''.join(json.dumps({'id': i, 'text': d}) + '\n' for i, d in enumerate(docs)).encode()


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> dict:
  """Corpus files of every format (their documents by path) and a tiny BPE tokenizer.json."""
  root = tmp_path_factory.mktemp('dump')
  docs = {name: make_docs(150, seed) for seed, name in enumerate(
      ['a.jsonl.zst', 'b.parquet', 'c.jsonl.gz', 'd.jsonl', 'hf'])}
  (root / 'a.jsonl.zst').write_bytes(zstandard.ZstdCompressor().compress(jsonl(docs['a.jsonl.zst'])))
  pq.write_table(pa.table({'text': docs['b.parquet']}), root / 'b.parquet', row_group_size=64)
  (root / 'c.jsonl.gz').write_bytes(gzip.compress(jsonl(docs['c.jsonl.gz'])))
  (root / 'd.jsonl').write_bytes(jsonl(docs['d.jsonl']))
  hf = root / 'hf'  # the layout of datasets' save_to_disk: state.json names the arrow files
  hf.mkdir()
  for i, part in enumerate((docs['hf'][:100], docs['hf'][100:])):
    table = pa.table({'text': part, 'n': list(range(len(part)))})
    with pa.ipc.new_stream(str(hf / f'data-{i:05d}-of-00002.arrow'), table.schema) as w:
      w.write_table(table, max_chunksize=40)
  (hf / 'state.json').write_text(json.dumps({'_data_files': [
      {'filename': f'data-{i:05d}-of-00002.arrow'} for i in range(2)]}))
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator([d for ds in docs.values() for d in ds], trainers.BpeTrainer(
      vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tok.save(str(root / 'tokenizer.json'))
  return {'root': root, 'docs': docs, 'tokenizer': str(root / 'tokenizer.json')}


def test_every_format_yields_its_documents_in_order(corpus):
  root = corpus['root']
  for name, docs in corpus['docs'].items():
    paths = documents.expand(str(root / name))
    got = [d for p in paths for d in documents.read(p)]
    assert got == [d.encode() for d in docs], name
  assert len(documents.expand(str(root / 'hf'))) == 2
  assert [documents.file_format(f'x/y.{e}') for e in ('txt', 'json', 'json.gz', 'arrow')] == [
      'text', 'jsonl', 'jsonl.gz', 'arrow']
  with pytest.raises(ValueError, match=r"--text_field='body' is invalid: allowed a field"):
    next(documents.read(str(root / 'a.jsonl.zst'), 'body'))
  with pytest.raises(ValueError, match=r"--text_field='body' is invalid"):
    next(documents.read(str(root / 'b.parquet'), 'body'))


def test_held_out_split_is_by_document_hash():
  docs = [d.encode() for d in make_docs(2000, 7)]
  held = [d for d in docs if documents.held_out(d, 0.1)]
  assert 0.08 < len(held) / len(docs) < 0.12
  h = lambda d: int.from_bytes(hashlib.blake2b(d, digest_size=8).digest(), 'big') / 2 ** 64
  assert held == [d for d in docs if h(d) < 0.1]
  assert all(documents.held_out(d, 0.2) for d in held)  # nested in the fraction


def records(paths: list[str]) -> list[bytes]:
  out = []
  for path in paths:
    reader = ArrayRecordReader(path)
    out += reader.read_all()
    reader.close()
  return out


def expected_streams(files: list[list[bytes]], tok, fraction: float) -> list[dict]:
  """Per input file, the token stream of each split: documents in order, EOS after each."""
  dtype = tokenizer_lib.token_dtype(tok.vocab_size)
  out = []
  for docs in files:
    split = {'train': [], 'eval': []}
    for d in docs:
      split['eval' if documents.held_out(d, fraction) else 'train'] += [
          *tok.encode(d).tolist(), tok.eos_id]
    out.append({k: np.asarray(v, dtype) for k, v in split.items()})
  return out


def check_shards(out: str, streams: list[dict], chunk: int, dtype) -> None:
  """Each file's records are its streams' chunks; the rest shards its tails' chunks."""
  for split in ('train', 'eval'):
    tails = []
    for i, s in enumerate(streams):
      k = len(s[split]) // chunk
      got = records(sorted(glob.glob(f'{out}/{split}-{i:05d}-*.array_record')))
      assert got == [s[split][j * chunk:(j + 1) * chunk].tobytes() for j in range(k)]
      tails.append(s[split][k * chunk:])
    tail = np.concatenate(tails).astype(dtype)
    got = records(sorted(glob.glob(f'{out}/{split}-rest-*.array_record')))
    assert got == [tail[j * chunk:(j + 1) * chunk].tobytes() for j in range(len(tail) // chunk)]


@pytest.fixture(scope='module')
def prepared(corpus, tmp_path_factory) -> str:
  """A JSONL.zst and a Parquet file through prepare with tokenizer.json on two workers."""
  out = str(tmp_path_factory.mktemp('prepared'))
  prepare.main([f'--input={corpus["root"]}/[ab].*', f'--output={out}',
                f'--tokenizer={corpus["tokenizer"]}', '--workers=2', '--chunk_tokens=132',
                '--shard_chunks=16', '--eval_fraction=0.1'])
  return out


def test_prepare_with_tokenizers_on_two_workers_then_resume(corpus, prepared, capsys):
  tok = tokenizer_lib.load(corpus['tokenizer'])
  meta = json.load(open(os.path.join(prepared, 'meta.json')))
  assert tok.vocab_size == meta['vocab_size'] == 300
  assert meta['eos_id'] == tok.eos_id == tok._tok.token_to_id(EOS)  # pylint: disable=protected-access
  assert meta['dtype'] == 'uint16' and meta['inputs'] == 2
  files = [[d.encode() for d in corpus['docs'][n]] for n in ('a.jsonl.zst', 'b.parquet')]
  streams = expected_streams(files, tok, 0.1)
  check_shards(prepared, streams, 132, np.uint16)
  assert meta['train_tokens'] == sum(len(s['train']) for s in streams)
  assert meta['eval_documents'] == sum(documents.held_out(d, 0.1) for f in files for d in f)

  shard_files = sorted(glob.glob(f'{prepared}/*.array_record'))
  mtimes = {p: os.stat(p).st_mtime_ns for p in shard_files}
  contents = {p: open(p, 'rb').read() for p in shard_files}
  args = [f'--input={corpus["root"]}/[ab].*', f'--output={prepared}',
          f'--tokenizer={corpus["tokenizer"]}', '--workers=2', '--chunk_tokens=132',
          '--shard_chunks=16', '--eval_fraction=0.1']
  assert prepare.main(args) == meta  # both files done: nothing re-tokenized
  assert '2 of 2 input files already done' in capsys.readouterr().err
  assert all(os.stat(p).st_mtime_ns == t for p, t in mtimes.items() if '-rest-' not in p)
  os.remove(f'{prepared}/.prepare/done-00001.json')  # file 1 killed mid-way
  os.remove(sorted(glob.glob(f'{prepared}/train-00001-*'))[-1])
  assert prepare.main(args) == meta
  assert '1 of 2 input files already done' in capsys.readouterr().err
  assert sorted(glob.glob(f'{prepared}/*.array_record')) == shard_files
  assert all(open(p, 'rb').read() == c for p, c in contents.items())
  assert all(os.stat(p).st_mtime_ns == t for p, t in mtimes.items() if '-00000-' in p)
  with pytest.raises(SystemExit, match='prepared with other chunk_tokens'):
    prepare.main(args[:4] + ['--chunk_tokens=64'])


def test_prepare_with_sentencepiece_on_other_formats(corpus, tmp_path):
  import sentencepiece as spm
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus['docs']['d.jsonl']),
                                 model_writer=model, vocab_size=120, model_type='unigram')
  (tmp_path / 'sp.model').write_bytes(model.getvalue())
  out = str(tmp_path / 'out')
  meta = prepare.main([f'--input={corpus["root"]}/[ch]*', f'--output={out}',
                       f'--tokenizer={tmp_path}/sp.model', '--chunk_tokens=100',
                       '--eval_fraction=0.1', '--progress_every=0.01'])
  tok = tokenizer_lib.load(f'{tmp_path}/sp.model')
  assert meta['vocab_size'] == tok.vocab_size == 120 and meta['eos_id'] == tok.eos_id >= 0
  assert meta['dtype'] == 'uint8' and meta['inputs'] == 3  # c.jsonl.gz and hf's 2 arrow files
  hf = corpus['docs']['hf']
  files = [[d.encode() for d in docs] for docs in (corpus['docs']['c.jsonl.gz'], hf[:100], hf[100:])]
  check_shards(out, expected_streams(files, tok, 0.1), 100, np.uint8)


def shard_config(prepared: str, **overrides):
  cfg = tiny_config(**{'data.source': f'array_record:{prepared}/train-*.array_record',
                       'model.vocab_size': 300, 'train.log_every': 1, **overrides})
  return cfg


def test_vocab_smaller_than_the_shards_is_a_config_error(prepared, tmp_path):
  with pytest.raises(ValueError, match=r'model.vocab_size=256 is invalid: allowed >= 300 for '
                     r'data.source=.array_record:') as e:
    config_lib.validate(shard_config(prepared, **{'model.vocab_size': 256}))
  assert '\n' not in str(e.value)
  config_lib.validate(shard_config(prepared))


@pytest.mark.slow  # three training runs
def test_trainer_on_prepared_shards_resumes_bitwise(prepared, tmp_path):
  """Shards of the tokenizers tokenizer, with document masking: kill at step 3, resume."""
  cfg = shard_config(prepared, **{'data.document_mask': True})
  config_lib.validate(cfg)
  full = train_rung(cfg, str(tmp_path / 'full'))
  assert train_rung(cfg, str(tmp_path / 'killed'), stop_at_step=3)['status'] == 'stopped'
  resumed = train_rung(cfg, str(tmp_path / 'killed'))
  for f in ('train_log.jsonl', 'layer_metrics.jsonl', 'eval_log.jsonl'):
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith('perf/')} for r in rs]
    assert strip(read_jsonl(tmp_path / 'full' / f)) == strip(read_jsonl(tmp_path / 'killed' / f))
  assert full['final_eval_loss'] == resumed['final_eval_loss']
  info = json.loads((tmp_path / 'full' / 'data_info.json').read_text())
  assert info['vocab_size'] == 300 and info['eos_id'] == 0


def test_document_mask_keeps_each_document_to_itself():
  """With data.document_mask the logits of a document do not depend on the tokens of an
  earlier one in the same sequence; without it they do."""
  cfg = tiny_config(**{'data.source': 'grammar', 'data.seq_len': 64, 'data.document_mask': True})
  batch = next(data.train_iterator(cfg.data, 0))
  seg = batch['segments']
  inputs = batch['inputs']
  eos_before = [[int(np.sum(r[:t] == vocab.EOS)) for t in range(len(r))] for r in inputs]
  np.testing.assert_array_equal(seg, eos_before)  # an EOS ends its document
  row = int(np.argmax((seg[:, 2:] > 0).any(1) & (seg[:, 1] == 0)))
  first_end = int(np.argmax(seg[row] > 0))  # the first position of document 1
  assert 1 < first_end < 60
  model = make_model(cfg)
  params = model.init(jax.random.PRNGKey(0), inputs[:1])['params']
  x, s = inputs[row:row + 1], seg[row:row + 1]
  y = x.copy()
  y[0, :first_end - 1] = (y[0, :first_end - 1] + 7) % 101  # change document 0, keep its EOS
  masked = [model.apply({'params': params}, t, None, s)[0] for t in (x, y)]
  np.testing.assert_allclose(masked[0][0, first_end:], masked[1][0, first_end:], atol=1e-6)
  plain = [model.apply({'params': params}, t)[0] for t in (x, y)]
  assert np.abs(plain[0][0, first_end:] - plain[1][0, first_end:]).max() > 1e-3


def test_python_docs_is_deterministic_with_a_held_out_split():
  info = python_docs.info()
  docs = python_docs.documents()
  h = hashlib.sha256()
  for d in docs:
    h.update(len(d).to_bytes(8, 'little') + d)
  assert info['sha256'] == h.hexdigest() and info['documents'] == len(docs) > 100
  assert info['bytes'] > 500_000 and b'The "with" statement' in b''.join(docs)
  cfg = tiny_config(**{'data.source': 'python_docs', 'data.seq_len': 64}).data
  data.validate(cfg, 256, process_count=1)
  assert data.required_vocab(cfg) == 256
  held = b''.join(d + b'\0' for d in docs if documents.held_out(d, cfg.eval_fraction))
  kept = b''.join(d + b'\0' for d in docs if not documents.held_out(d, cfg.eval_fraction))
  ev = data.eval_batches(cfg, 0, 1)[0]
  assert bytes(ev['inputs'][0].astype(np.uint8)) == held[:64]
  windows = {kept[k * 65:k * 65 + 64] for k in range(len(kept) // 65)}
  assert all(bytes(row.astype(np.uint8)) in windows
             for row in next(data.train_iterator(cfg, 0))['inputs'])
  assert data.data_info(cfg)['eval_documents'] == sum(
      documents.held_out(d, cfg.eval_fraction) for d in docs)


def test_python_docs_cache_holds_the_parsed_documents_until_a_source_changes(
    tmp_path, monkeypatch, capfd):
  """A standard library of two files: the second load reads the cache (parsing is off), a
  changed file is parsed again, a damaged cache is ignored with one warning and rewritten,
  an unwritable one warns and the documents still come."""
  root, cache = tmp_path / 'lib', tmp_path / 'cache' / 'python_docs.bin'
  (root / 'pkg').mkdir(parents=True)
  (root / 'a.py').write_text('"""Module a."""\n\ndef f():\n  """Function f."""\n')
  (root / 'pkg' / 'b.py').write_text('class B:\n  """Class B."""\n')
  (root / 'test').mkdir()
  (root / 'test' / 'c.py').write_text('"""Left out."""\n')
  monkeypatch.setenv(python_docs.CACHE_ENV, str(cache))
  topics = tuple(t.strip().encode() for t in python_docs._topics() if t.strip())  # pylint: disable=protected-access
  parsed = python_docs.load(str(root))
  assert parsed == topics + (b'Module a.\n\nFunction f.', b'Class B.') and cache.exists()
  parse = python_docs._module_docstrings  # pylint: disable=protected-access
  with monkeypatch.context() as m:
    m.setattr(python_docs, '_module_docstrings', lambda *_: pytest.fail('parsed, not cached'))
    assert python_docs.load(str(root)) == parsed
  (root / 'pkg' / 'b.py').write_text('class B:\n  """Class B, changed."""\n')
  assert python_docs.load(str(root))[-1] == b'Class B, changed.'
  cache.write_bytes(cache.read_bytes()[:-5])  # a torn file
  assert python_docs.load(str(root))[-1] == b'Class B, changed.'
  assert capfd.readouterr().err.count(f'warning: python_docs cache {cache} ignored') == 1
  with monkeypatch.context() as m:
    m.setattr(python_docs, '_module_docstrings', lambda *_: pytest.fail('parsed, not cached'))
    assert python_docs.load(str(root))[-1] == b'Class B, changed.'  # rewritten whole
  monkeypatch.setenv(python_docs.CACHE_ENV, str(root / 'a.py' / 'python_docs.bin'))
  assert python_docs.load(str(root)) == topics + tuple(
      d.encode() for d in parse(str(root), ['a.py', 'pkg/b.py']))
  assert 'python_docs.bin not written' in capfd.readouterr().err


@pytest.mark.slow  # the GCS server, shards through it, a training run
def test_prepare_from_and_to_a_bucket_then_train_from_it(corpus, prepared, gcs, tmp_path,
                                                         monkeypatch):
  """Input, tokenizer and output in a bucket (the local GCS server): the same shards as a
  local prepare, and a rung trains on them (read through the local shard cache) with the
  losses of the local shards."""
  bucket = f'gs://{gcs.bucket()}'
  for f in ('a.jsonl.zst', 'b.parquet', 'tokenizer.json'):
    storage.write_bytes(f'{bucket}/dump/{f}', (corpus['root'] / f).read_bytes())
  meta = prepare.main([f'--input={bucket}/dump/[ab].*', f'--output={bucket}/shards',
                       f'--tokenizer={bucket}/dump/tokenizer.json', '--chunk_tokens=132',
                       '--shard_chunks=16', '--eval_fraction=0.1'])
  local = json.load(open(os.path.join(prepared, 'meta.json')))
  assert {k: v for k, v in meta.items() if k != 'tokenizer'} == {
      k: v for k, v in local.items() if k != 'tokenizer'}
  shards = sorted(os.path.basename(p) for p in glob.glob(f'{prepared}/*.array_record'))
  assert storage.listdir(f'{bucket}/shards') == sorted(['.prepare', 'meta.json', *shards])
  for name in shards:
    assert storage.read_bytes(f'{bucket}/shards/{name}') == open(f'{prepared}/{name}', 'rb').read()

  monkeypatch.setenv('DEPTHSCALE_CACHE', str(tmp_path / 'cache'))
  steps = {'train.steps': 2, 'train.eval_every': 2, 'train.checkpoint_every': 2}
  from_bucket = train_rung(shard_config(f'{bucket}/shards', **steps), f'{bucket}/rung')
  from_disk = train_rung(shard_config(prepared, **steps), str(tmp_path / 'rung'))
  assert from_bucket['final_eval_loss'] == from_disk['final_eval_loss']
  assert len(os.listdir(tmp_path / 'cache')) == len(shards)
