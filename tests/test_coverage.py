"""Coverage guards: every entry of every method table has a registered test of its defining
property (tests.helpers.covers); a new entry without one fails here, naming it."""

import glob
import importlib
import os

import pytest

from depthscale.model import inner_norms, norms, ops, parametrization, placements, residual, taper
from depthscale.training import dynamics, optim
from tests import helpers

TABLES = {
    'residual.DESIGNS': residual.DESIGNS, 'residual.VALUE_RESIDUALS': residual.VALUE_RESIDUALS,
    'residual.PARALLEL_BLOCKS': residual.PARALLEL_BLOCKS, 'residual.LAURELS': residual.LAURELS,
    'norms.NORMS': norms.NORMS, 'inner_norms.QK_NORMS': inner_norms.QK_NORMS,
    'parametrization.PARAMETRIZATIONS': parametrization.PARAMETRIZATIONS,
    'parametrization.INITS': parametrization.INITS,
    'dynamics.PRORES': dynamics.PRORES, 'dynamics.PRORES_VALUES': dynamics.PRORES_VALUES,
    'dynamics.LAYERSKIP_CURRICULA': dynamics.LAYERSKIP_CURRICULA,
    'ops.MLPS': ops.MLPS, 'taper.TAPERS': taper.TAPERS,
    'optim.OPTIMIZERS': optim.OPTIMIZERS,
}
MODULES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), 'test_*.py')))


@pytest.fixture(scope='module')
def covered():
  """The registry after importing every test module (whatever subset pytest selected)."""
  assert len(MODULES) >= 20
  for path in MODULES:
    importlib.import_module('tests.' + os.path.splitext(os.path.basename(path))[0])
  return helpers.COVERED


@pytest.mark.parametrize('table', sorted(TABLES))
def test_every_table_entry_has_a_property_test(covered, table):
  missing = set(TABLES[table]) - covered.get(table, set())
  assert not missing, f'{table}: no test registered with tests.helpers.covers for {sorted(missing)}'


def test_norm_placements_are_covered_by_the_training_cases():
  """The placement table's guard lives beside its cases (test_norm_training)."""
  from tests.test_norm_training import CASES
  used = {c.get('model.block') for c in CASES.values()}
  assert set(placements.PLACEMENTS) - {'branchnorm'} <= used
