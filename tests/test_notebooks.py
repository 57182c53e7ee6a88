"""Every paper notebook (notebooks/*.py, jupytext percent format) executes top to bottom
with nbclient in smoke mode: any error or failed mechanism assertion fails the test."""

import glob
import os

import jupytext
import pytest
from nbclient import NotebookClient

from depthscale import notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.py')))


def test_every_notebook_is_collected():
  assert len(NOTEBOOKS) >= 6


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
  monkeypatch.setenv(notebook.SMOKE_ENV, '1')
  monkeypatch.setenv(notebook.OUTPUTS_ENV, str(tmp_path))
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')])))
  nb = jupytext.read(path)
  assert nb.cells[0].cell_type == 'markdown', 'the first cell states the claim and the paper'
  NotebookClient(nb, timeout=600, kernel_name='python3',
                 resources={'metadata': {'path': os.path.dirname(path)}}).execute()
  name = os.path.splitext(os.path.basename(path))[0]
  assert glob.glob(os.path.join(tmp_path, name, '*.png')), 'the notebook saves its plots as PNG'
