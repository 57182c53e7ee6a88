"""Paper-size ladders are checked: every experiments/repro_*.py paper ladder has a recorded
TPU dry run (experiments/dryrun/*.json, written by --dry_run --topology --dry_run_json), each
record is of the ladder as it is now (rung names, parameter counts), and the experiment's
docstring and every doc that names the record state its result."""

import glob
import json
import os

import pytest

from depthscale.experiment import load_module, resolve, split_arg
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


def test_every_paper_ladder_has_a_record():
  recorded = {_record(path)['config'] for path in RECORDS}
  repros = sorted(glob.glob(os.path.join(ROOT, 'experiments', 'repro_*.py')))
  assert repros
  for repro in repros:
    name = os.path.relpath(repro, ROOT)
    assert f'{name}:paper' in recorded, f'{name}: no paper dry run in experiments/dryrun/'


@pytest.mark.parametrize('path', RECORDS, ids=os.path.basename)
def test_docstring_states_the_recorded_dry_run_of_the_current_ladder(path):
  record = _record(path)
  config_arg = os.path.join(ROOT, record['config'])
  assert dryrun.summary(record) in _words(load_module(split_arg(config_arg)[0]).__doc__)
  resolved = resolve(config_arg)
  assert [r.name for r, _ in resolved] == [r['rung'] for r in record['rungs']]
  assert [param_count(cfg) for _, cfg in resolved] == [r['params'] for r in record['rungs']]


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
