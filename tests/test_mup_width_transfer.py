"""experiments/mup_width_transfer.py: its rungs, and the width rule that makes its muP family
muP: Adam's rate and the init variance of hidden matrices scale as base width / width, while
standard parametrization keeps both at every width."""

import os

import jax
import numpy as np
import pytest

from depthscale import experiment
from depthscale.model import parametrization as pz
from depthscale.model.transformer import make_model
from depthscale.training.optim import lr_multipliers, make_optimizer
from depthscale.training.steps import init_state
from tests.helpers import ROOT

PATH = os.path.join(ROOT, 'experiments', 'mup_width_transfer.py')
MODULE = experiment.load_module(PATH)


def test_ladder_names_and_overrides():
  rungs = {r.name: cfg for r, cfg in experiment.resolve(PATH)}
  assert len(rungs) == len(MODULE.FAMILIES) * len(MODULE.WIDTHS) * len(MODULE.LRS) and len(MODULE.LRS) >= 4
  for f in MODULE.FAMILIES:
    for d in MODULE.WIDTHS:
      for lr in MODULE.LRS:
        m = rungs[f'{f}_d{d}_lr{lr:g}']
        assert (m.model.parametrization, m.model.d_model, m.optim.lr) == (f, d, lr)
        assert m.model.d_model // m.model.num_heads == MODULE.HEAD_DIM  # head_dim fixed
        assert (m.model.num_layers, m.model.base_d_model) == (4, min(MODULE.WIDTHS))
  assert {r.name for r, _ in experiment.resolve(PATH + ':mup')} == {n for n in rungs if n.startswith('mup_')}


def _params(cfg):
  return jax.eval_shape(lambda: init_state(make_model(cfg), make_optimizer(cfg), 0, cfg.data.seq_len))['params']


@pytest.mark.parametrize('family', ['standard', 'mup'])
def test_hidden_matrices_scale_with_width_under_mup_only(family):
  base = min(MODULE.WIDTHS)
  for d in MODULE.WIDTHS:
    (_, cfg), = experiment.resolve(PATH, rung=f'{family}_d{d}_lr{MODULE.LRS[0]:g}')
    params = _params(cfg)
    mults = lr_multipliers(cfg, 0, params)
    want = base / d if family == 'mup' else 1.0
    for sub in ('attn', 'mlp'):
      for name in params['blocks'][sub]:  # q, kv, o, wi, wo: the hidden matrices
        np.testing.assert_allclose(np.asarray(mults['blocks'][sub][name]), want, err_msg=name)
    kept = [mults['embedding'], *jax.tree_util.tree_leaves(mults['blocks']['attn_norm'])]
    assert all(float(m) == 1.0 for m in kept)  # the embedding and the gains keep eta
    var = pz.init_std(cfg.model, 'q', d, d) ** 2 / pz.init_std(cfg.model, 'embedding', d, d) ** 2
    assert var == pytest.approx(want)
