"""The launcher tests' ladder (tests/test_launch.py): tiny rungs on the synthetic mix.

get_ladder(None): depths 1 and 2. get_ladder('sweep'): a learning-rate sweep of the depth-1
model (two rates, then one seed at the better one). get_ladder('long'): the depth-2 rung
for 1,000 steps, checkpointed every 50: the tests freeze its process (SIGSTOP) at its first
checkpoint, so it is stopped or loses its node in the middle whatever the host's load."""

from depthscale.config import default_config
from depthscale.ladder import Rung, depth_sweep, lr_sweep


def get_config(arg: str | None = None):
  c = default_config()
  c.model.d_model, c.model.num_heads = 32, 2
  c.data.seq_len, c.data.batch_size, c.data.eval_batches = 32, 4, 1
  c.train.steps, c.train.log_every, c.optim.warmup_steps = 20, 5, 2
  c.train.eval_every = c.train.checkpoint_every = 10
  c.metrics.analysis_every, c.metrics.images = 0, False
  if arg == 'long':
    c.train.steps, c.train.log_every, c.train.checkpoint_every = 1000, 50, 50
    c.train.eval_every = 1000
  return c


def get_ladder(arg: str | None = None):
  if arg == 'sweep':
    return lr_sweep({'v': {'model.num_layers': 1}}, [1e-3, 1e-2], seeds=1)
  if arg == 'long':
    return [Rung('L2', {'model.num_layers': 2})]
  return depth_sweep([1, 2])
