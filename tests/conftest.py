"""pytest set-up: one persistent JAX compilation cache for the session, fast-compiling XLA
flags, slow modules first, module-scoped fixtures built on one worker, a GCS-compatible
server on 127.0.0.1 (the `gcs` fixture), host caches of the test run's own."""

import functools
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.gcs import GcsServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Identical programs (seeds of a ladder, a run and its resume, CLI subprocesses, notebook
# kernels, xdist workers) compile once per test run: the cache is a temporary directory of
# the run's (made by the controller, removed when it ends), and the environment reaches
# every worker and subprocess. Programs under 0.3 s to compile (eager ops of the
# references) are not worth a disk entry each.
RUN_CACHE = None
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  RUN_CACHE = os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
      prefix='depthscale-tests-jax-cache-')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.3')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
# The test extra brings libtpu; the tests run on the CPU and compile for TPU topologies
# explicitly, so no process probes for a TPU (seconds per process, and warnings on stderr).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# The suite is compile-bound (thousands of tiny programs): LLVM -O0 and XLA's classic loop
# emitters compile them 2-3x faster than the defaults (-O2, fusion emitters), with the same
# IEEE operations. Each program's machine code is made in one piece, not split into modules
# for parallel code generation: on cores that the two workers already fill, splitting cost
# ~30% of a model gradient's compile time (tests/README.md). A user's run keeps the defaults;
# tests/test_train.py runs a train step with them too (the uncached options), and the
# train-bound notebooks run at -O1 (tests/test_notebooks.py).
FAST_COMPILE = ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false '
                '--xla_cpu_parallel_codegen_split_count=1')


def _xla_accepts(flags: str) -> bool:
  """Whether this jaxlib knows the flags: XLA aborts on an unknown one when it makes a
  client (jaxlib alone, 0.3 s; through `import jax` it took 2.6 s before any worker started)."""
  env = {**os.environ, 'XLA_FLAGS': flags}
  probe = 'from jaxlib import xla_client; xla_client.make_cpu_client()'
  return subprocess.run([sys.executable, '-c', probe], env=env, capture_output=True).returncode == 0


if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  _fast = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
  if _xla_accepts(_fast):
    os.environ['XLA_FLAGS'] = _fast


# Scheduled first: the slowest modules, and test_stalls.py, which mostly waits out storage
# deadlines (left in collection order it came last and ran alone for ~2 minutes after the
# other worker had finished).
SLOW_MODULES = ('test_notebooks.py', 'test_launch.py', 'test_sharding.py', 'test_bucket.py',
                'test_stalls.py', 'test_cli.py', 'test_train.py')


# The tests of several modules that share a session fixture go to one worker together, so
# that it is built once (`one_step_rung`: 7 s per worker on the AMD host, 12-16 s on the
# Xeon). Checked at collection: a test that uses one of these fixtures and is not listed
# here is an error.
SESSION_FIXTURE_USERS = {
    'one_step_rung': ('tests/test_notebooks.py::test_init_grad_norms_match_the_step_zero_record',
                      'tests/test_train.py::test_layer_grad_norm_matches_a_float64_norm'),
}


class ModuleFixtureScheduling(LoadScopeScheduling):
  """pytest -n: the tests of a module with a module-scoped fixture go to one worker, so the
  fixture is built once (the 8-device `cases` run had run on both workers at once), and so do
  the users of a fixture in SESSION_FIXTURE_USERS; every other test is scheduled on its own,
  in collection order (slowest modules first)."""

  def __init__(self, config, log=None):
    super().__init__(config, log)
    config.option.loadscopereorder = False  # not largest scope first

  def _split_scope(self, nodeid: str) -> str:
    for fixture, users in SESSION_FIXTURE_USERS.items():
      if nodeid in users:
        return fixture
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
  multi-device subprocess tests (the `cases` worker run, two processes) are marked slow; a
  user of a shared session fixture not in SESSION_FIXTURE_USERS is refused."""
  for item in items:
    for fixture, users in SESSION_FIXTURE_USERS.items():
      if fixture in getattr(item, 'fixturenames', ()) and item.nodeid not in users:
        raise pytest.UsageError(f'{item.nodeid} uses {fixture}: list it in '
                                'SESSION_FIXTURE_USERS (tests/conftest.py)')
    if item.path.name == 'test_sharding.py' and (
        'cases' in getattr(item, 'fixturenames', ()) or 'two_processes' in item.name):
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: item.path.name not in SLOW_MODULES)


def pytest_unconfigure(config):
  """The run's compilation cache goes with the run (workers leave it to the controller)."""
  if RUN_CACHE and not hasattr(config, 'workerinput'):
    shutil.rmtree(RUN_CACHE, ignore_errors=True)


@pytest.fixture(scope='session', autouse=True)
def host_caches(tmp_path_factory):
  """The test worker's host cache files (depthscale.host_cache: the CPU options of
  training/cpu_calibration.py, the python_docs corpus) in a temporary directory, for its
  subprocesses too: no test reads or writes the user's."""
  from depthscale.data import python_docs  # pylint: disable=import-outside-toplevel
  from depthscale.training import cpu_calibration  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp('host_cache')
  os.environ[cpu_calibration.CACHE_ENV] = str(root / 'cpu_options.json')
  os.environ[python_docs.CACHE_ENV] = str(root / 'python_docs.bin')


@pytest.fixture(scope='session')
def one_step_rung(tmp_path_factory):
  """(config, directory) of tiny_config trained for one step, every default path on: the
  step-0 records that several modules check against their own computation."""
  from depthscale.training.loop import train_rung  # pylint: disable=import-outside-toplevel
  from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel
  cfg = tiny_config(**{'train.steps': 1})
  path = tmp_path_factory.mktemp('one_step')
  train_rung(cfg, str(path))
  return cfg, path


@pytest.fixture(scope='session')
def gcs(tmp_path_factory):
  """A GCS-compatible server on 127.0.0.1 for this worker (tests/gcs.py); from its start this
  process and its subprocesses talk to it for every gs:// path."""
  server = GcsServer(str(tmp_path_factory.mktemp('gcs') / 'objects')).start()
  os.environ.update(server.env)
  yield server
  server.stop()
