"""The `data.source` registry: parsing, validation and random-access records."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import grain
from ml_collections import ConfigDict
import numpy as np

from depthscale import storage
from depthscale.data import documents
from depthscale.data import grammar
from depthscale.data import khop
from depthscale.data import python_docs
from depthscale.data import rng
from depthscale.data import shards
from depthscale.data import text
from depthscale.data import tokenizer
from depthscale.data import vocab
from depthscale.errors import ConfigError

SOURCES = {
    'grammar': 'seeded nested PCFG language (data.grammar_seed); see grammar.py',
    'khop': 'multi-hop variable binding, hop labels 1..data.khop_max; see khop.py',
    'mix': 'even records grammar, odd records khop (the default)',
    'python_docs': 'English prose shipped with Python (pydoc topics, stdlib docstrings)',
    'text:GLOB': 'local text files, data.tokenizer tokens, last data.eval_fraction held out',
    'array_record:GLOB': 'token chunk shards written by python -m depthscale.data.prepare',
}
SYNTHETIC = ('grammar', 'khop', 'mix')
BUILTIN = SYNTHETIC + ('python_docs',)  # kinds without a glob

Example = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Source:
  """Random-access examples by global record index; both splits are unbounded."""
  train: Callable[[int], Example]
  eval: Callable[[int], Example]
  local: bool = False  # train(i) indexes this process's own stream, not the global one


def _invalid(field: str, value, allowed: str) -> ConfigError:
  return ConfigError(f'{field}={value!r} is invalid: allowed {allowed}')


def parse(source: str) -> tuple[str, str]:
  """Splits `data.source` into (kind, glob); glob is '' for synthetic kinds."""
  kind, colon, pattern = source.partition(':')
  if (kind in BUILTIN and not colon) or (kind in ('text', 'array_record') and pattern):
    return kind, pattern
  raise _invalid('data.source', source, ', '.join(SOURCES))


def khop_spec(cfg: ConfigDict) -> khop.Spec:
  """The k-hop episode shape of a data config."""
  return khop.Spec(cfg.khop_max, cfg.khop_queries, cfg.khop_distractors)


def check(cfg: ConfigDict) -> None:
  """Raises ConfigError for a source-specific field that cannot work."""
  kind, pattern = parse(cfg.source)
  length = cfg.seq_len + 1
  if kind in ('khop', 'mix'):
    spec = khop_spec(cfg)
    if spec.max_hops < 1:
      raise _invalid('data.khop_max', spec.max_hops, 'a positive int')
    if spec.queries < 1:
      raise _invalid('data.khop_queries', spec.queries, 'a positive int')
    if spec.distractors < 0:
      raise _invalid('data.khop_distractors', spec.distractors, 'a non-negative int')
    if spec.max_vars > vocab.NUM_VARS:
      raise _invalid('data.khop_max', spec.max_hops, f'khop_max * khop_queries + '
                     f'khop_distractors <= {vocab.NUM_VARS} variables')
    if spec.min_length > length:
      raise _invalid('data.seq_len', cfg.seq_len, f'>= {spec.min_length - 1} so a '
                     f'chain of khop_max={spec.max_hops} hops and its query fit')
  elif kind in ('text', 'python_docs'):
    if kind == 'text':
      text.expand(pattern)
    tokenizer.load(cfg.tokenizer)
    if not 0 < cfg.eval_fraction < 1:
      raise _invalid('data.eval_fraction', cfg.eval_fraction, 'a number in (0, 1)')
  elif kind == 'array_record':
    text.expand(shards.eval_pattern(pattern))
    chunk = shards.read_meta(pattern)['chunk_tokens']
    if chunk < length:
      raise _invalid('data.seq_len', cfg.seq_len, f'<= {chunk - 1} (chunk_tokens - 1 '
                     'of the shards; or re-run prepare with a larger --chunk_tokens)')


def required_vocab(cfg: ConfigDict) -> int:
  """The smallest model vocab_size that covers every token of the source."""
  kind, pattern = parse(cfg.source)
  if kind == 'khop':
    return vocab.KHOP_VOCAB
  if kind in SYNTHETIC:
    return vocab.GRAMMAR_VOCAB
  if kind in ('text', 'python_docs'):
    return tokenizer.load(cfg.tokenizer).vocab_size
  return shards.read_meta(pattern)['vocab_size']


def eos_id(cfg: ConfigDict) -> int:
  """The token that ends each document (or sentence, or episode) of the source."""
  kind, pattern = parse(cfg.source)
  if kind in SYNTHETIC:
    return vocab.EOS
  if kind in ('text', 'python_docs'):
    return tokenizer.load(cfg.tokenizer).eos_id
  return shards.read_meta(pattern)['eos_id']


def data_info(cfg: ConfigDict) -> dict:
  """Provenance of the source's data: python_docs' hash and size, the shards' meta.json."""
  kind, pattern = parse(cfg.source)
  if kind == 'python_docs':
    docs = python_docs.documents()
    held = sum(documents.held_out(d, cfg.eval_fraction) for d in docs)
    return {**python_docs.info(), 'eval_documents': held, 'train_documents': len(docs) - held}
  if kind == 'array_record':
    return {'corpus': pattern, **shards.read_meta(pattern)}
  if kind == 'text':
    return {'corpus': pattern, 'files': len(text.expand(pattern))}
  return {'corpus': kind}


def hop_values(cfg: ConfigDict) -> list[int]:
  """The hop counts k reported by per-k eval accuracy ([] without k-hop)."""
  if parse(cfg.source)[0] in ('khop', 'mix'):
    return list(range(1, cfg.khop_max + 1))
  return []


def segments(inputs: np.ndarray, eos: int) -> np.ndarray:
  """Document index of each input position: the number of EOS tokens before it (an EOS
  belongs to the document it ends)."""
  return np.concatenate([[0], np.cumsum(inputs[:-1] == eos)]).astype(np.int32)


def example(tokens: np.ndarray, hop: np.ndarray | None = None, eos: int | None = None) -> Example:
  """Builds the model example of a window of seq_len + 1 tokens; with eos (document
  masking) also the inputs' segment ids."""
  tokens = tokens.astype(np.int32)
  n = len(tokens) - 1
  out = {'inputs': tokens[:-1], 'targets': tokens[1:],
         'weights': np.ones(n, np.float32),
         'hop': np.zeros(n, np.int32) if hop is None else hop}
  if eos is not None:
    out['segments'] = segments(out['inputs'], eos)
  return out


@dataclasses.dataclass(frozen=True)
class _Synthetic:
  """Records of grammar, khop or mix; record i is seeded by (seed, split, i)."""
  kind: str
  seed: int
  length: int
  language: grammar.Grammar
  spec: khop.Spec
  eos: int | None

  def record(self, split: str, index: int) -> Example:
    kind = self.kind
    if kind == 'mix':
      kind, index = ('grammar', 'khop')[index % 2], index // 2
    r = rng.make(self.seed, kind, split, index)
    if kind == 'grammar':
      return example(grammar.tokens(self.language, r, self.length), eos=self.eos)
    return example(*khop.tokens(self.spec, r, self.length), eos=self.eos)


@functools.lru_cache(maxsize=2)
def _python_docs(tokenizer_spec: str, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
  """The (train, eval) token streams of python_docs, split by document hash (cached)."""
  tok = tokenizer.load(tokenizer_spec)
  split = {True: [], False: []}
  for d in python_docs.documents():
    split[documents.held_out(d, eval_fraction)].append(d)
  return text.concat(split[False], tok), text.concat(split[True], tok)


class ShardWindows:
  """Windows of `length` tokens cut from every fixed-length chunk record of the files
  (default: all files matching pattern)."""

  def __init__(self, pattern: str, length: int, files: list[str] | None = None):
    meta = shards.read_meta(pattern)
    # ArrayRecord opens local files only: shards in a bucket are read from a local copy
    self._source = grain.sources.ArrayRecordDataSource(
        [storage.local_copy(f) for f in files or text.expand(pattern)])
    self._dtype = np.dtype(meta['dtype'])
    self._length = length
    self._per_chunk = meta['chunk_tokens'] // length

  def __len__(self) -> int:
    return len(self._source) * self._per_chunk

  def __getitem__(self, i: int) -> np.ndarray:
    chunk, w = divmod(i, self._per_chunk)
    tokens = np.frombuffer(self._source[chunk], self._dtype)
    return tokens[w * self._length:(w + 1) * self._length]


def _require_windows(windows: text.Windows | ShardWindows, source: str, split: str) -> None:
  """Raises if a split holds no window."""
  if not len(windows):
    raise _invalid('data.source', source, f'a corpus whose {split} split holds at '
                   'least one window of seq_len + 1 tokens (see data.eval_fraction)')


def _corpus_windows(cfg: ConfigDict, process_index: int = 0, process_count: int = 1
                    ) -> tuple[text.Windows | ShardWindows, ...]:
  """The (train, eval) windows of a corpus source (this process's train files for shards);
  raises if a split holds none."""
  kind, pattern = parse(cfg.source)
  length = cfg.seq_len + 1
  if kind in ('text', 'python_docs'):
    train, held = (text.corpus(pattern, cfg.tokenizer, cfg.eval_fraction) if kind == 'text'
                   else _python_docs(cfg.tokenizer, cfg.eval_fraction))
    train, held = text.Windows(train, length), text.Windows(held, length)
  else:
    files = shards.process_files(pattern, process_index, process_count)
    train = ShardWindows(pattern, length, files)
    held = ShardWindows(shards.eval_pattern(pattern), length)
  _require_windows(train, cfg.source, 'train')
  _require_windows(held, cfg.source, 'eval')
  return train, held


def measure(cfg: ConfigDict) -> dict[str, int]:
  """Windows of seq_len + 1 tokens per split of a corpus source ({} for synthetic ones,
  which are unbounded); opens and reads the corpus, raises ConfigError if a split has none."""
  check(cfg)
  if parse(cfg.source)[0] in SYNTHETIC:
    return {}
  return dict(zip(('train', 'eval'), map(len, _corpus_windows(cfg))))


def build(cfg: ConfigDict, seed: int, process_index: int = 0, process_count: int = 1) -> Source:
  """The records of `data.source`, drawn from seed.

  Synthetic records are sampled from (seed, split, index). A corpus's train
  record i is window order[i], where order visits every window once per epoch
  in a grain index shuffle of (seed, epoch); eval record i is window i (mod
  the number of eval windows), in stream order. With array_record shards and
  several processes, process p reads only its slice of the train files
  (shards.process_files) and shuffles its own windows with (seed, p): a `local`
  source. With data.document_mask every example has its segment ids.
  """
  check(cfg)
  kind, _ = parse(cfg.source)
  eos = eos_id(cfg) if cfg.document_mask else None
  if kind in SYNTHETIC:
    s = _Synthetic(kind, seed, cfg.seq_len + 1, grammar.make(cfg.grammar_seed), khop_spec(cfg),
                   eos)
    return Source(functools.partial(s.record, 'train'), functools.partial(s.record, 'eval'))
  local = kind == 'array_record' and process_count > 1
  train, held = _corpus_windows(cfg, process_index, process_count)
  if local:
    seed = int(np.random.SeedSequence([seed, process_index]).generate_state(1)[0])
  order = grain.MapDataset.range(len(train)).shuffle(seed).repeat()
  num_held = len(held)
  return Source(lambda i: example(train[order[i]], eos=eos),
                lambda i: example(held[i % num_held], eos=eos), local)
