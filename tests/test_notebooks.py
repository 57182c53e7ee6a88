"""Every paper notebook (notebooks/*.py, jupytext percent format) executes top to bottom
with nbclient in smoke mode: any error or failed mechanism assertion fails the test."""

import glob
import os

import jupytext
import numpy as np
import pytest
from nbclient import NotebookClient

from depthscale.results import notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.py')))
# Smoke mode is compile-bound (a dozen small rungs, each compiling its train, eval and
# statistics steps) except in these, whose steps dominate: they run at -O1, the others at
# the suite's -O0. Measured one notebook at a time on an idle host (2026-12-06), -O0 / -O1:
# width_depth_ladder 85 / 61 s, pre_vs_post_ln 100 / 65 s; curse_of_depth 36 / 39 s,
# depth_transfer 44 / 52 s, norm_free 26 / 30 s, training_dynamics 51 / 63 s.
TRAIN_BOUND = ('width_depth_ladder.py', 'pre_vs_post_ln.py')


def test_every_notebook_is_collected():
  assert len(NOTEBOOKS) >= 6


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
  monkeypatch.setenv(notebook.SMOKE_ENV, '1')
  monkeypatch.setenv(notebook.OUTPUTS_ENV, str(tmp_path))
  if os.path.basename(path) in TRAIN_BOUND:
    monkeypatch.setenv('XLA_FLAGS', os.environ.get('XLA_FLAGS', '').replace(
        'optimization_level=0', 'optimization_level=1'))
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  nb = jupytext.read(path)
  assert nb.cells[0].cell_type == 'markdown', 'the first cell states the claim and the paper'
  NotebookClient(nb, timeout=600, kernel_name='python3',
                 resources={'metadata': {'path': os.path.dirname(path)}}).execute()
  name = os.path.splitext(os.path.basename(path))[0]
  assert glob.glob(os.path.join(tmp_path, name, '*.png')), 'the notebook saves its plots as PNG'


def test_init_grad_norms_match_the_step_zero_record(one_step_rung):
  from depthscale.storage import read_jsonl
  cfg, path = one_step_rung
  step0 = read_jsonl(os.path.join(path, 'layer_metrics.jsonl'))[0]
  assert step0['step'] == 0
  np.testing.assert_allclose(notebook.init_grad_norms(cfg)[0], step0['grad_norm'], rtol=1e-5)
