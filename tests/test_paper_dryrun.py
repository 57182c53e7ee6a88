"""Paper-size ladders are checked: every experiments/repro_*.py paper ladder has a recorded
TPU dry run and one on the fewest H100 nodes that hold it (experiments/dryrun/*.json, written
by --dry_run --topology [--num_nodes] --dry_run_json [--config.SECTION.FIELD=VALUE ...]),
each record is of the ladder as it is now with the config flags the record names (rung
names, parameter counts), the paper sizes are the papers' models (a tokenizer's vocabulary;
LLaMA's block where the paper trains LLaMA models), and the experiment's docstring and every
doc that names the record state its result."""

import glob
import json
import os

import pytest

from depthscale.experiment import LLAMA_BLOCK, LLAMA_VOCAB, load_module, resolve, split_arg
from depthscale.training import dryrun
from tests.helpers import param_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = sorted(glob.glob(os.path.join(ROOT, 'experiments', 'dryrun', '*.json')))
DOCS = [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def _record(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _words(text: str) -> str:
  return ' '.join(text.split())


REPROS = sorted(glob.glob(os.path.join(ROOT, 'experiments', 'repro_*.py')))
BYTE_VOCAB = 256  # the byte tokens of the smoke and cpu sizes
# paper sizes that are LLaMA models: the papers train LLaMA models (curse_of_depth,
# training_dynamics) or their models are not known and LLaMA's block stands in
LLAMA_STYLE = ('repro_curse_of_depth', 'repro_training_dynamics', 'repro_width_depth_ladder')


def test_every_paper_ladder_has_a_record():
  recorded = {_record(path)['config'] for path in RECORDS if 'num_nodes' not in _record(path)}
  assert REPROS
  for repro in REPROS:
    name = os.path.relpath(repro, ROOT)
    assert f'{name}:paper' in recorded, f'{name}: no paper dry run in experiments/dryrun/'


def test_every_paper_ladder_has_an_h100_record_that_holds_it():
  """The GPU records: each paper ladder on the fewest H100 nodes that hold it (the docstring
  says which smaller count does not), the 1B rung on one and on two nodes."""
  h100 = {}
  for path in RECORDS:
    record = _record(path)
    if record['topology'] == 'h100-8':
      assert os.path.basename(path).endswith(f'.h100-8x{record["num_nodes"]}.json')
      h100.setdefault(record['config'], []).append(record)
  for repro in REPROS:
    name = os.path.relpath(repro, ROOT)
    records = h100.get(f'{name}:paper', [])
    assert len(records) == 1 and all(r['fits'] for r in records[0]['rungs']), repro
  assert sorted(r['num_nodes'] for r in h100['experiments/pod_1b.py']) == [1, 2]


_COUNTS: dict[str, int] = {}


def _param_count(cfg) -> int:
  """param_count once per shape (dryrun's key: rungs that differ in seed or rate share it,
  and so do a ladder's TPU and GPU records): a paper ladder has up to 8x more rungs than
  models, each traced for its shapes."""
  key = dryrun._shape_key(cfg)  # pylint: disable=protected-access
  if key not in _COUNTS:
    _COUNTS[key] = param_count(cfg)
  return _COUNTS[key]


@pytest.mark.slow  # parameter shapes of every paper-size rung
@pytest.mark.parametrize('path', RECORDS, ids=os.path.basename)
def test_docstring_states_the_recorded_dry_run_of_the_current_ladder(path):
  record = _record(path)
  config_arg = os.path.join(ROOT, record['config'])
  assert dryrun.summary(record) in _words(load_module(split_arg(config_arg)[0]).__doc__)
  resolved = resolve(config_arg, record.get('overrides'))
  assert [r.name for r, _ in resolved] == [r['rung'] for r in record['rungs']]
  assert [_param_count(cfg) for _, cfg in resolved] == [r['params'] for r in record['rungs']]


def test_docs_naming_a_record_state_its_result():
  named = []
  for doc in DOCS:
    with open(doc) as f:
      text = _words(f.read())
    for path in RECORDS:
      if os.path.relpath(path, ROOT) in text:
        named.append((os.path.relpath(doc, ROOT), os.path.relpath(path, ROOT)))
        assert dryrun.summary(_record(path)) in text, f'{named[-1]}: the doc omits the result'
  pod_recipe = 'experiments/dryrun/pod_1b.v5p-64.json'
  assert {('README.md', pod_recipe), ('docs/scaling.md', pod_recipe)} <= set(named)
  assert {('docs/scaling.md', f'experiments/dryrun/pod_1b.h100-8x{n}.json')
          for n in (1, 2)} <= set(named)


def _embedding_params(cfg) -> int:
  """Parameters outside the non-embedding count: token embedding, learned positions, head."""
  m = cfg.model
  rows = m.vocab_size * (1 if m.tie_embeddings else 2)
  return (rows + (cfg.data.seq_len if m.position == 'learned' else 0)) * m.d_model


@pytest.mark.parametrize('path', RECORDS, ids=os.path.basename)
def test_every_record_is_of_its_ladders_vocabulary(path):
  """Each record was compiled with the vocabulary its ladder has now: its embedding parameters
  are those of that vocabulary (and of learned positions where the ladder has them)."""
  record = _record(path)
  resolved = resolve(os.path.join(ROOT, record['config']), record.get('overrides'))
  for (rung, cfg), report in zip(resolved, record['rungs']):
    assert report['params'] - report['non_embedding_params'] == _embedding_params(cfg), rung.name


@pytest.mark.parametrize('repro', REPROS, ids=lambda r: os.path.splitext(os.path.basename(r))[0])
def test_every_paper_size_has_a_tokenizers_vocabulary(repro):
  """Every rung of every paper ladder trains on a real tokenizer's tokens, not bytes."""
  vocab = {cfg.model.vocab_size for _, cfg in resolve(f'{repro}:paper')}
  assert min(vocab) > BYTE_VOCAB, f'{repro}: paper size with vocabulary {sorted(vocab)}'


@pytest.mark.parametrize('name', LLAMA_STYLE)
def test_llama_style_paper_sizes_are_llama_models(name):
  """A LLaMA-style paper size has RMSNorm, SwiGLU, RoPE and LLaMA's vocabulary, recorded on
  TPU and on H100 (records of the current ladder: the tests above); its cpu size keeps the
  byte vocabulary."""
  config = f'experiments/{name}.py:paper'
  for _, cfg in resolve(os.path.join(ROOT, config)):
    block = {field: cfg.model[field] for field in LLAMA_BLOCK}
    assert (block, cfg.model.vocab_size) == (LLAMA_BLOCK, LLAMA_VOCAB)
  platforms = sorted('num_nodes' in r for r in map(_record, RECORDS) if r['config'] == config)
  assert platforms == [False, True], f'{config}: wants one TPU and one H100 record'
  assert all(cfg.model.vocab_size == BYTE_VOCAB
             for _, cfg in resolve(os.path.join(ROOT, f'experiments/{name}.py:cpu')))
