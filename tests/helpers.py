"""Shared test helpers: the tiny config every training test starts from."""

from depthscale.config import default_config


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

