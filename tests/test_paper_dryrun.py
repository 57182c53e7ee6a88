"""Paper-size ladders are checked: each recorded TPU dry run (experiments/dryrun/*.json,
written by --dry_run --topology --dry_run_json) is of the ladder as it is now (rung names,
parameter counts) and the experiment's docstring states its result."""

import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthscale.experiment import load_module, resolve, split_arg
from depthscale.model.transformer import make_model
from depthscale.training import dryrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = sorted(glob.glob(os.path.join(ROOT, 'experiments', 'dryrun', '*.json')))


def _params(cfg) -> int:
  tokens = jax.ShapeDtypeStruct((1, cfg.data.seq_len), jnp.int32)
  shapes = jax.eval_shape(make_model(cfg).init, jax.random.PRNGKey(0), tokens)['params']
  return sum(int(np.prod(x.value.shape if hasattr(x, 'value') else x.shape))
             for x in jax.tree.leaves(shapes, is_leaf=lambda x: hasattr(x, 'value')))


def test_records_exist():
  assert RECORDS


@pytest.mark.parametrize('path', RECORDS, ids=os.path.basename)
def test_docstring_states_the_recorded_dry_run_of_the_current_ladder(path):
  with open(path) as f:
    record = json.load(f)
  config_arg = os.path.join(ROOT, record['config'])
  doc = ' '.join(load_module(split_arg(config_arg)[0]).__doc__.split())
  assert dryrun.summary(record) in doc
  resolved = resolve(config_arg)
  assert [r.name for r, _ in resolved] == [r['rung'] for r in record['rungs']]
  assert [_params(cfg) for _, cfg in resolved] == [r['params'] for r in record['rungs']]
