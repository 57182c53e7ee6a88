"""Kept records (depthscale.results.records): a ladder packed into one file loads as its
directory does, the same runs give the same bytes, and docs/claims.md is what the
repository's records regenerate."""

import json
import os

import pandas as pd
import pytest

from depthscale import claims as claims_cli
from depthscale import keep
from depthscale.results import load, records
from tests.helpers import ROOT
from tests.test_claims import ladder


def _ladder_with_logs(path):
  ladder(path, {'pre_ln': [2.0, 2.1, 2.2], 'post_ln': [3.5, 3.4, 3.6]})
  with open(path / 'pre_ln_s0' / 'eval_log.jsonl', 'w') as f:
    f.write(json.dumps({'step': 5, 'eval_loss': 2.5}) + '\n' + json.dumps({'step': 9, 'eval_loss': 2.0}) + '\n')
  (path / 'pre_ln_s0' / 'checkpoints').mkdir()  # never kept
  (path / 'pre_ln_s0' / 'checkpoints' / 'big').write_bytes(b'x' * 1000)
  (path / 'not_a_rung').mkdir()


def test_a_record_loads_as_its_ladder_directory(tmp_path):
  _ladder_with_logs(tmp_path / 'runs')
  out = tmp_path / 'records' / records.name('repro_pre_vs_post_ln', 'tiny')
  size = records.pack(str(tmp_path / 'runs'), str(out), 'a test machine')
  assert size == out.stat().st_size < 2000
  first = out.read_bytes()
  records.pack(str(tmp_path / 'runs'), str(out), 'a test machine')
  assert out.read_bytes() == first  # the same runs, the same bytes
  direct, kept = load(str(tmp_path / 'runs')), load(str(out))
  for frame in ('configs', 'summaries', 'layers', 'scalars', 'choices'):
    pd.testing.assert_frame_equal(getattr(kept, frame), getattr(direct, frame), check_dtype=False)
  assert list(kept.scalars.value) == [2.5, 2.0] and len(kept.summaries) == 6
  assert records.key(str(out)) == ('repro_pre_vs_post_ln', 'tiny')
  assert records.read(str(out))[1] == 'a test machine'


def test_the_claims_command_without_runs_reads_the_records(tmp_path, monkeypatch, capsys):
  _ladder_with_logs(tmp_path / 'runs')
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit, match='2'):
    claims_cli.main(['--out', 'claims.md'])
  assert 'no records in records/' in capsys.readouterr().err
  keep.main(['--runs', 'repro_pre_vs_post_ln:tiny=runs', '--note', 'measured on a test machine'])
  claims_cli.main(['--out', 'from_records.md'])
  claims_cli.main(['--runs', 'repro_pre_vs_post_ln:tiny=runs', '--note', 'measured on a test machine',
                   '--out', 'from_runs.md'])
  text = (tmp_path / 'from_records.md').read_text()
  assert text == (tmp_path / 'from_runs.md').read_text()
  assert 'Runs read: repro_pre_vs_post_ln:tiny. measured on a test machine.' in text
  with pytest.raises(SystemExit, match='2'):
    keep.main(['--runs', 'a:b=nowhere', '--note', 'x'])


def test_docs_claims_is_what_the_records_regenerate(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  kept = records.kept()
  assert kept, 'records/ holds the runs behind docs/claims.md'
  assert sum(os.path.getsize(p) for p in kept) < 5e6  # a few MB at most
  claims_cli.main(['--out', str(tmp_path / 'claims.md')])
  assert (tmp_path / 'claims.md').read_bytes() == open(os.path.join(ROOT, 'docs', 'claims.md'), 'rb').read()
