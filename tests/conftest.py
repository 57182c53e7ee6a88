"""Shared test helpers: a tiny config; one persistent JAX compilation cache for the session."""

import os
import tempfile

# Identical programs (seeds of a ladder, a run and its resume, CLI subprocesses, notebook
# kernels, xdist workers) compile once: the environment reaches every subprocess.
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), 'depthscale-tests-jax-cache'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

from depthscale.config import default_config  # pylint: disable=wrong-import-position

SLOW_MODULES = ('test_notebooks.py', 'test_sharding.py', 'test_cli.py', 'test_train.py')


def pytest_collection_modifyitems(items):
  """The slowest modules first, so that parallel workers (pytest -n) finish together."""
  items.sort(key=lambda item: item.path.name not in SLOW_MODULES)


def tiny_config(**overrides):
  """A model and run small enough for unit tests (seconds per compile)."""
  c = default_config()
  c.model.num_layers = 3
  c.model.d_model = 32
  c.model.num_heads = 2
  c.data.seq_len = 32
  c.data.batch_size = 4
  c.data.eval_batches = 1
  c.train.steps = 6
  c.train.log_every = 2
  c.train.eval_every = 3
  c.train.checkpoint_every = 2
  c.optim.warmup_steps = 2
  c.metrics.analysis_every = 0  # analyses and images have tests of their own (test_compare)
  c.metrics.images = False
  c.metrics.analysis_batch_size = 2
  for key, value in overrides.items():
    section, field = key.split('.')
    c[section][field] = value
  return c

