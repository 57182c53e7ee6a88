"""Tests of depthscale.data: determinism, resume, sharding, tasks, text, shards."""

import glob
import json
import os
import random
import sys

from ml_collections import ConfigDict
import numpy as np
import pytest

from array_record.python.array_record_module import ArrayRecordReader

from depthscale import data
from depthscale.data import documents
from depthscale.data import grammar
from depthscale.data import prepare
from depthscale.data import sources
from depthscale.data import text
from depthscale.data import tokenizer
from depthscale.data import vocab


def make_cfg(**overrides) -> ConfigDict:
  cfg = ConfigDict(dict(
      source='mix', seq_len=128, batch_size=8, eval_batches=2, tokenizer='byte',
      eval_fraction=0.05, khop_max=4, grammar_seed=0, khop_queries=4,
      khop_distractors=4, read_threads=2, prefetch=4, document_mask=False, workers=0))
  cfg.update(overrides)
  return cfg


def take(it, n: int) -> list[dict]:
  return [next(it) for _ in range(n)]


def assert_same(a: list[dict], b: list[dict]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def stream_bytes(pattern: str, eval_fraction: float) -> tuple[bytes, bytes]:
  """The byte-token stream of a corpus (NUL after each file), split train/eval."""
  stream = b''.join(open(p, 'rb').read() + b'\0' for p in sorted(glob.glob(pattern)))
  cut = len(stream) - round(len(stream) * eval_fraction)
  return stream[:cut], stream[cut:]


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> str:
  """Ten documents of seeded random words; returns a glob over them."""
  root = tmp_path_factory.mktemp('corpus')
  rng = random.Random(0)
  words = [''.join(rng.choice('abcdefghij') for _ in range(rng.randint(2, 8)))
           for _ in range(300)]
  for d in range(10):
    (root / f'doc{d}.txt').write_text(' '.join(rng.choice(words) for _ in range(400)))
  return str(root / '*.txt')


SHARD_EVAL_FRACTION = 0.3


@pytest.fixture(scope='module')
def shard_dir(tmp_path_factory, corpus) -> str:
  out = tmp_path_factory.mktemp('shards')
  prepare.main([f'--input={corpus}', f'--output={out}', '--chunk_tokens=516',
                f'--eval_fraction={SHARD_EVAL_FRACTION}', '--shard_chunks=2'])
  return str(out)


@pytest.mark.parametrize('source', ['grammar', 'khop', 'mix'])
def test_batches_shape_and_determinism(source):
  cfg = make_cfg(source=source)
  a = take(data.train_iterator(cfg, seed=1), 3)
  assert_same(a, take(data.train_iterator(cfg, seed=1), 3))
  b = take(data.train_iterator(cfg, seed=2), 3)
  assert not np.array_equal(a[0]['inputs'], b[0]['inputs'])
  batch = a[0]
  assert batch['inputs'].shape == (8, 128) and batch['inputs'].dtype == np.int32
  assert batch['targets'].dtype == np.int32 and batch['hop'].dtype == np.int32
  assert batch['weights'].dtype == np.float32 and np.all(batch['weights'] == 1)
  np.testing.assert_array_equal(batch['inputs'][:, 1:], batch['targets'][:, :-1])
  assert batch['inputs'].max() < data.required_vocab(cfg)
  assert not np.array_equal(a[0]['inputs'], a[1]['inputs'])


def test_eval_is_fixed_and_disjoint_from_train():
  cfg = make_cfg()
  ev = data.eval_batches(cfg, seed=0, num_batches=2)
  assert_same(ev, data.eval_batches(cfg, seed=0, num_batches=2))
  train = np.concatenate([b['inputs'] for b in take(data.train_iterator(cfg, seed=0), 4)])
  train_rows = {r.tobytes() for r in train}
  assert not any(r.tobytes() in train_rows for b in ev for r in b['inputs'])
  assert ev[0]['inputs'].shape == (8, 128)


@pytest.mark.parametrize('source', ['mix', 'text'])
def test_resume_from_json_state(source, corpus):
  cfg = make_cfg(source='mix' if source == 'mix' else f'text:{corpus}', seq_len=64)
  it = data.train_iterator(cfg, seed=3)
  take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  expected = take(it, 4)
  resumed = data.train_iterator(cfg, seed=3)
  resumed.set_state(state)
  assert_same(take(resumed, 4), expected)


@pytest.mark.parametrize('source', ['mix', 'text'])
def test_process_shards_union_is_global_batch(source, corpus):
  cfg = make_cfg(source='mix' if source == 'mix' else f'text:{corpus}', seq_len=64)
  steps = 3
  full = take(data.train_iterator(cfg, seed=5), steps)
  parts = [take(data.train_iterator(cfg, seed=5, process_index=p, process_count=2), steps)
           for p in range(2)]
  for s in range(steps):
    for p in range(2):
      assert parts[p][s]['inputs'].shape == (4, 64)
      for k in full[s]:  # Process p holds rows 4p .. 4p + 3 of the global batch.
        np.testing.assert_array_equal(parts[p][s][k], full[s][k][4 * p:4 * p + 4])
    rows = [r.tobytes() for p in range(2) for r in parts[p][s]['inputs']]
    assert len(set(rows)) == len(rows) == 8
    if source == 'mix':  # Both tasks on every process.
      assert all(parts[p][s]['hop'][1::2].any() and not parts[p][s]['hop'][0::2].any()
                 for p in range(2))
  ev = [data.eval_batches(cfg, 0, 2, process_index=p, process_count=2) for p in range(2)]
  full_ev = data.eval_batches(cfg, 0, 2)
  for s in range(2):
    np.testing.assert_array_equal(ev[1][s]["targets"], full_ev[s]["targets"][4:])


def solve_khop(tokens: np.ndarray) -> dict[int, tuple[int, int]]:
  """Re-solves every query by executing the assignments; {answer pos: (value, hops)}."""
  answers, env, i, t = {}, {}, 0, list(tokens)
  while i + 3 < len(t):
    if t[i] == vocab.EOS:
      env, i = {}, i + 1
    elif t[i] == vocab.QUERY:
      var, hops = t[i + 1], 0
      while var in env and vocab.VAR0 <= var < vocab.VALUE0:
        var, hops = env[var], hops + 1
      assert t[i + 2] == vocab.EQ and vocab.VALUE0 <= var < vocab.KHOP_VOCAB
      answers[i + 3] = (var, hops)
      i += 5
    else:
      assert t[i + 1] == vocab.EQ and t[i + 3] == vocab.SEMI and t[i] not in env
      assert t[i + 2] >= vocab.VALUE0 or t[i + 2] in env  # Bound before read.
      env[t[i]] = t[i + 2]
      i += 4
  return answers


def test_khop_answers_and_hop_labels():
  cfg = make_cfg(source='khop', batch_size=16)
  batch = next(data.train_iterator(cfg, seed=0))
  seen = set()
  for inputs, targets, hop in zip(batch['inputs'], batch['targets'], batch['hop']):
    tokens = np.concatenate([inputs, targets[-1:]])
    answers = solve_khop(tokens)
    labelled = {int(t) + 1 for t in np.flatnonzero(hop)}
    assert labelled == {p for p in answers if p < len(tokens)}
    for pos, (value, hops) in answers.items():
      assert tokens[pos] == value and hop[pos - 1] == hops
      assert inputs[pos - 1] == vocab.EQ
      seen.add(hops)
  assert seen == set(data.hop_values(cfg)) == {1, 2, 3, 4}
  mix = next(data.train_iterator(make_cfg(source='mix'), seed=0))
  assert not mix['hop'][0::2].any() and mix['hop'][1::2].any()


def test_grammar_structure():
  cfg = make_cfg(source='grammar', seq_len=256)
  batch = next(data.train_iterator(cfg, seed=0))
  g = grammar.make(0)
  closing = {c: o for o, c in g.brackets}
  deepest = 0
  for row in batch['inputs']:
    assert row.min() >= vocab.EOS and (row >= vocab.GRAMMAR0).mean() > 0.85
    stack = []
    for tok in row:  # Brackets never cross and never close unopened.
      if tok in closing.values():
        stack.append(tok)
      elif tok in closing:
        assert stack.pop() == closing[tok]
      elif tok == vocab.EOS:
        assert not stack
      deepest = max(deepest, len(stack))
  assert deepest >= 1
  other = next(data.train_iterator(make_cfg(source='grammar', seq_len=256, grammar_seed=1), seed=0))
  assert not np.array_equal(np.bincount(batch['inputs'].ravel(), minlength=256),
                            np.bincount(other['inputs'].ravel(), minlength=256))
  assert data.hop_values(cfg) == []


def test_text_source_round_trip(corpus):
  cfg = make_cfg(source=f'text:{corpus}', seq_len=64, eval_fraction=0.1)
  train_text, eval_text = stream_bytes(corpus, 0.1)
  batches = take(data.train_iterator(cfg, seed=0), 3)
  for b in batches:
    for inp, tgt in zip(b['inputs'], b['targets']):
      window = bytes(inp.astype(np.uint8)) + bytes(tgt[-1:].astype(np.uint8))
      start = train_text.find(window)
      assert start >= 0 and start % 65 == 0 and window not in eval_text
  ev = data.eval_batches(cfg, seed=0, num_batches=2)
  windows = [bytes(r.astype(np.uint8)) for b in ev for r in b['inputs']]
  assert all(w in eval_text and w not in train_text for w in windows)
  assert windows[0] == eval_text[:64]
  source = sources.build(cfg, seed=0)  # One epoch visits every train window once.
  n = len(train_text) // 65
  epoch = {bytes(source.train(i)['inputs'].astype(np.uint8)) for i in range(n)}
  assert epoch == {train_text[k * 65:k * 65 + 64] for k in range(n)}
  assert data.required_vocab(cfg) == 256


def records(paths: list[str]) -> list[bytes]:
  out = []
  for path in paths:
    reader = ArrayRecordReader(path)
    out += reader.read_all()
    reader.close()
  return out


def test_array_record_round_trip(shard_dir, corpus):
  """Each file's documents (EOS after each) fill its records in order, shard_chunks per
  shard; the tails shorter than a record are concatenated, in file order, into the rest
  shards; a document is held out iff its hash says so."""
  meta = json.load(open(os.path.join(shard_dir, 'meta.json')))
  assert meta['vocab_size'] == 256 and meta['chunk_tokens'] == 516 and meta['dtype'] == 'uint8'
  files = sorted(glob.glob(corpus))
  tails = {'train': b'', 'eval': b''}
  for i, path in enumerate(files):
    doc = open(path, 'rb').read()
    split = 'eval' if documents.held_out(doc, SHARD_EVAL_FRACTION) else 'train'
    stream, k = doc + b'\0', (len(doc) + 1) // 516
    got = records(sorted(glob.glob(f'{shard_dir}/{split}-{i:05d}-*.array_record')))
    assert got == [stream[j * 516:(j + 1) * 516] for j in range(k)]
    assert len(glob.glob(f'{shard_dir}/{split}-{i:05d}-*.array_record')) == -(-k // 2)
    tails[split] += stream[k * 516:]
  for split, tail in tails.items():
    got = records(sorted(glob.glob(f'{shard_dir}/{split}-rest-*.array_record')))
    assert got == [tail[j * 516:(j + 1) * 516] for j in range(len(tail) // 516)]
  held = sum(documents.held_out(open(p, 'rb').read(), SHARD_EVAL_FRACTION) for p in files)
  assert meta['eval_documents'] == held and 0 < held < len(files)
  cfg = make_cfg(source=f'array_record:{shard_dir}/train-*.array_record', seq_len=128)
  data.validate(cfg, 256, process_count=1)
  allowed = {r[k * 129:(k + 1) * 129]  # chunks are 4 windows of 129 tokens
             for r in records(sorted(glob.glob(f'{shard_dir}/train-*.array_record')))
             for k in range(4)}
  rows = [bytes(np.concatenate([i, t[-1:]]).astype(np.uint8))
          for b in take(data.train_iterator(cfg, 0), 6) for i, t in zip(b['inputs'], b['targets'])]
  assert set(rows) <= allowed and len(set(rows)) == len(rows)
  with pytest.raises(ValueError, match='data.seq_len=600 is invalid: allowed <= 515'):
    data.validate(make_cfg(source=cfg.source, seq_len=600), 256, process_count=1)


def test_array_record_processes_read_their_own_files(shard_dir):
  """On P processes, process p reads only the train files p, p + P, ...; too few files
  for the processes is a config error."""
  cfg = make_cfg(source=f'array_record:{shard_dir}/train-*.array_record', seq_len=128,
                 batch_size=4)
  files = sorted(glob.glob(f'{shard_dir}/train-*.array_record'))
  for p in range(2):
    mine = {r[k * 129:(k + 1) * 129] for r in records(files[p::2]) for k in range(4)}
    rows = [bytes(np.concatenate([i, t[-1:]]).astype(np.uint8))
            for b in take(data.train_iterator(cfg, 0, process_index=p, process_count=2), 3)
            for i, t in zip(b['inputs'], b['targets'])]
    assert set(rows) <= mine and len(set(rows)) == len(rows)
  n = len(files) + 1
  with pytest.raises(ValueError, match=f'allowed at least process_count={n} train'):
    data.validate(make_cfg(source=cfg.source, seq_len=128, batch_size=n), 256, process_count=n)


@pytest.mark.parametrize('overrides, vocab_size, process_count, message', [
    (dict(source='nope'), 256, 1, r"data.source='nope' is invalid: allowed grammar, khop"),
    (dict(source='text:/nonexistent/*.txt'), 256, 1, 'matches at least one file'),
    (dict(source='grammar'), 100, 1, r'model.vocab_size=100 is invalid: allowed >= 235'),
    (dict(source='khop'), 100, 1, r'allowed >= 101'),
    (dict(seq_len=0), 256, 1, r'data.seq_len=0 is invalid: allowed a positive int'),
    (dict(batch_size=-8), 256, 1, r'data.batch_size=-8 is invalid'),
    (dict(batch_size=6), 256, 4, r'allowed a positive multiple of process_count=4'),
    (dict(seq_len=16), 256, 1, r"data.seq_len=16 is invalid: allowed >= 21"),
    (dict(tokenizer='missing.model', source=f'text:{__file__}'), 256, 1,
     r"data.tokenizer='missing.model' is invalid: allowed byte or the path"),
    (dict(source='array_record:/nonexistent/*.array_record'), 256, 1, "allowed a file pattern containing 'train'"),
    (dict(khop_max=20), 256, 1, r'data.khop_max=20 is invalid: allowed khop_max \* khop_queries'),
    (dict(workers=-1), 256, 1, r'data.workers=-1 is invalid: allowed 0'),
    (dict(source='python_docs:x'), 256, 1, r"data.source='python_docs:x' is invalid"),
])
def test_validation_messages(overrides, vocab_size, process_count, message):
  with pytest.raises(ValueError, match=message) as e:
    data.validate(make_cfg(**overrides), vocab_size, process_count=process_count)
  assert '\n' not in str(e.value)


def test_sentencepiece_missing_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, 'sentencepiece', None)  # import fails as if not installed
  tokenizer.load.cache_clear()
  with pytest.raises(ValueError, match='needs the sentencepiece package'):
    data.validate(make_cfg(source=f'text:{__file__}', tokenizer=__file__), 256, process_count=1)


def test_sentencepiece_tokenizer_encodes_a_text_source(corpus, tmp_path):
  """A SentencePiece model trained on the corpus: the text source's windows are its ids."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  spm.SentencePieceTrainer.train(input=sorted(glob.glob(corpus)), model_prefix=str(tmp_path / 'sp'),
                                 vocab_size=64, minloglevel=2)
  path = str(tmp_path / 'sp.model')
  tok = tokenizer.load(path)
  sp = spm.SentencePieceProcessor(model_file=path)
  assert tok.vocab_size == 64 and tok.eos_id == sp.eos_id() >= 0
  text = open(sorted(glob.glob(corpus))[0]).read()
  np.testing.assert_array_equal(tok.encode(text.encode()), sp.encode(text))
  cfg = make_cfg(source=f'text:{corpus}', tokenizer=path, seq_len=32)
  data.validate(cfg, 64, process_count=1)
  ids = np.concatenate([sp.encode(open(p).read()) + [sp.eos_id()]
                        for p in sorted(glob.glob(corpus))])
  window = next(data.train_iterator(cfg, seed=0))['inputs'][0]
  assert window.max() < 64 and any(np.array_equal(ids[i:i + 32], window)
                                   for i in range(0, len(ids) - 32, 33))


def test_validation_accepts_defaults():
  data.validate(make_cfg(), 256, process_count=1)
  assert data.required_vocab(make_cfg()) == vocab.GRAMMAR_VOCAB <= 256
  assert set(data.SOURCES) == {'grammar', 'khop', 'mix', 'python_docs', 'text:GLOB',
                               'array_record:GLOB'}


def test_stream_is_pinned():
  """Same (seed, index) -> same tokens on any machine and Python version."""
  source = sources.build(make_cfg(), seed=0)
  assert source.train(0)['inputs'][:6].tolist() == [154, 151, 131, 207, 167, 188]
  assert source.train(1)['inputs'][:6].tolist() == [68, 2, 87, 3, 49, 2]
  assert source.eval(0)['inputs'][:6].tolist() == [154, 120, 233, 1, 188, 132]


@pytest.mark.slow  # grain worker processes
def test_grain_worker_processes_give_the_same_batches_and_resume(shard_dir):
  """data.workers=2 reads in two grain worker processes: same batches as in-process, and
  its iterator state restores exactly."""
  cfg = make_cfg(source=f'array_record:{shard_dir}/train-*.array_record', seq_len=128,
                 batch_size=4, document_mask=True)
  expected = take(data.train_iterator(cfg, seed=2), 6)
  cfg.workers = 2
  it = data.train_iterator(cfg, seed=2)
  assert_same(take(it, 3), expected[:3])
  state = json.loads(json.dumps(it.get_state()))
  resumed = data.train_iterator(cfg, seed=2)
  resumed.set_state(state)
  assert_same(take(resumed, 3), expected[3:])


def test_text_globs_recurse_locally_and_skip_hidden_files(tmp_path):
  """A local glob is glob.glob's: `**` reaches subdirectories, wildcards skip hidden names."""
  (tmp_path / 'sub').mkdir()
  for f in ('a.txt', '.hidden.txt', 'sub/b.txt', 'sub/.c.txt'):
    (tmp_path / f).write_text('doc')
  assert text.expand(f'{tmp_path}/**/*.txt') == [f'{tmp_path}/a.txt', f'{tmp_path}/sub/b.txt']
  assert documents.expand(f'{tmp_path}/.*.txt') == [f'{tmp_path}/.hidden.txt']
