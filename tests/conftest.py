"""pytest set-up: one persistent JAX compilation cache for the session; slow modules first;
module-scoped fixtures built on one worker."""

import functools
import os
import tempfile

import pytest
from xdist.scheduler import LoadScopeScheduling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Identical programs (seeds of a ladder, a run and its resume, CLI subprocesses, notebook
# kernels, xdist workers) compile once: the environment reaches every subprocess.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), 'depthscale-tests-jax-cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
# The test extra brings libtpu; the tests run on the CPU and compile for TPU topologies
# explicitly, so no process probes for a TPU (seconds per process, and warnings on stderr).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The suite is compile-bound (thousands of tiny programs): LLVM's -O0 compiles them 2-4x
# faster than XLA's default -O2 and their numerics are the same IEEE operations. A user's run
# keeps -O2; tests/test_train.py runs a train step at -O2 too (the uncached options).
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()


SLOW_MODULES = ('test_notebooks.py', 'test_sharding.py', 'test_cli.py', 'test_train.py')


class ModuleFixtureScheduling(LoadScopeScheduling):
  """pytest -n: the tests of a module with a module-scoped fixture go to one worker, so the
  fixture is built once (the 8-device `cases` run had run on both workers at once); every
  other test is scheduled on its own, in collection order (slowest modules first)."""

  def __init__(self, config, log=None):
    super().__init__(config, log)
    config.option.loadscopereorder = False  # not largest scope first

  def _split_scope(self, nodeid: str) -> str:
    module = nodeid.split('::', 1)[0]
    return module if _has_module_fixture(module) else nodeid


@functools.lru_cache(maxsize=None)
def _has_module_fixture(module: str) -> bool:
  path = os.path.join(ROOT, module)
  return os.path.isfile(path) and "scope='module'" in open(path).read()


def pytest_xdist_make_scheduler(config, log):
  return ModuleFixtureScheduling(config, log)


def pytest_collection_modifyitems(items):
  """The slowest modules first, so that parallel workers (pytest -n) finish together; the
  multi-device subprocess tests (the `cases` worker run, two processes) are marked slow."""
  for item in items:
    if item.path.name == 'test_sharding.py' and (
        'cases' in getattr(item, 'fixturenames', ()) or 'two_processes' in item.name):
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: item.path.name not in SLOW_MODULES)
