"""The seam of the post-hoc procedures (depthscale.training.procedures): a registered
procedure's start replaces the initial parameters, its transform's state is what each step
updates, its summary fields reach summary.json, all without the loop naming it; a config
that sets a field no registered procedure reads fails before anything is written; the
entry points register the project's procedures."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.training import procedures
from depthscale.training.loop import train_rung
from tests.helpers import tiny_config

PROBE = {'model.num_layers': 2, 'model.d_model': 16, 'data.seq_len': 16,
         'data.source': 'grammar', 'train.steps': 3, 'train.log_every': 3,
         'train.eval_every': 3, 'train.checkpoint_every': 3, 'optim.warmup_steps': 1,
         'metrics.analysis_every': 0, 'metrics.images': False, 'posthoc.remove_norms_start': 7}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTED = 100.0  # the transform's final-norm bias before the last update


def test_a_registered_procedure_reaches_the_loop_through_the_seam(tmp_path, monkeypatch,
                                                                  capsys):
  monkeypatch.setattr(procedures, '_REGISTERED', {})
  seen = {}

  def start(cfg, checked, workdir, sharding, fresh):
    seen['fresh'] = jax.device_get(fresh)
    halved = jax.tree.map(lambda w: w / 2, seen['fresh'])
    return procedures.Start(halved, {'probe_checked': checked}, 'starts halved')

  def transform(cfg, model, params):
    def before(state, step, batch):
      seen.setdefault('steps', []).append(step)
      if step == 0:
        seen['first'] = jax.device_get(state['params'])
      if step == cfg.train.steps - 1:
        norm = {**state['params']['final_norm'], 'bias': state['params']['final_norm']['bias']
                * 0 + PLANTED}
        return {**state, 'params': {**state['params'], 'final_norm': norm}}
      return state
    return before

  procedures.register(procedures.Procedure(
      'probe', switch='remove_norms_start', fields=('remove_norms_start',),
      check=lambda cfg, workdir: cfg.posthoc.remove_norms_start * 2, start=start,
      transform=transform,
      summary=lambda p: {'probe_bias': float(np.mean(p['final_norm']['bias']))}))
  summary = train_rung(tiny_config(**PROBE), str(tmp_path / 'r'), name='r')
  assert 'r starts halved' in capsys.readouterr().out
  assert seen['steps'] == [0, 1, 2]
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b / 2), seen['first'], seen['fresh'])
  assert summary['probe_checked'] == 14
  assert summary['probe_bias'] == pytest.approx(PLANTED, abs=0.1)  # one update after it
  assert json.loads((tmp_path / 'r' / 'summary.json').read_text())['probe_checked'] == 14


def test_a_field_no_registered_procedure_reads_fails_before_anything_is_written(tmp_path,
                                                                              monkeypatch):
  monkeypatch.setattr(procedures, '_REGISTERED', {})
  workdir = str(tmp_path / 'r')
  with pytest.raises(ConfigError, match=r'^posthoc.remove_norms_start=7 is invalid: allowed 0 '
                                        r'unless a registered procedure reads it \(registered: '
                                        r'none; `import depthscale.posthoc`'):
    train_rung(tiny_config(**PROBE), workdir)
  assert not storage.exists(workdir)


@pytest.mark.slow
def test_the_command_line_registers_the_post_hoc_procedures():
  """A fresh process that imports the CLI (so depthscale.experiment, which run_ladder and
  the notebooks use) knows both procedures."""
  probe = ('import depthscale.main; from depthscale.training import procedures; '
           'from tests.helpers import tiny_config; print([p.name for p in procedures.active('
           "tiny_config(**{'posthoc.init_from': 'L4', 'posthoc.remove_norms_every': 2}))])")
  out = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True,
                       check=True, cwd=ROOT).stdout
  assert out.strip() == "['init_from', 'ln_free']"
