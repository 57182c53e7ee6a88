"""Residual designs at a fixed budget across aspect ratios (DepthBench-style).

Every residual-stream design of depthscale.residual on the same width-depth ladder: the
non-embedding budget is fixed (~400k parameters of the standard block) while
d_model / num_layers goes from shallow-wide (L2, D128) to deep-narrow (L16, D48), with
the same data, steps and recipe for every rung. The question (DepthBench, Pre-LN vs HC vs
AttnRes): does a design turn extra depth into lower loss at a fixed size?

Run:
  python -m depthscale.main --config=experiments/residual_designs.py --workdir=runs/residual_designs
  python -m depthscale.main --config=experiments/residual_designs.py:standard,hyper_connections --workdir=runs/rd
The optional argument is a comma-separated subset of the designs below.

Runtime: 9 designs x 4 shapes = 36 rungs of 300 steps (batch 16 x 128 tokens); roughly
1-2 minutes per rung on a 2-core CPU, about 1 hour in all (an estimate, not measured).
Expected result (not yet measured here; the hypothesis from DepthBench): standard Pre-LN
gains little or loses from L8 to L16 at this budget, while hyper_connections and attn_res
keep improving or hold their loss at the deepest, narrowest shape. The final table lists
final eval loss per rung; compare rows with the same design across the four shapes.
Note: designs add their own (small) parameters on top of the matched standard budget;
each rung's summary.json reports the real count.
"""

from depthscale.config import ConfigError, default_config
from depthscale.ladder import budget_sweep, cross

BUDGET = 400_000  # non-embedding parameters of the standard block stack
DEPTHS = [2, 4, 8, 16]
DESIGNS = {
    'standard': {},
    'hyper_connections': {'model.residual': 'hyper_connections'},
    'mhc': {'model.residual': 'mhc'},
    'denseformer': {'model.residual': 'denseformer'},
    'attn_res': {'model.residual': 'attn_res'},
    'block_attn_res': {'model.residual': 'block_attn_res', 'model.attn_res_blocks': 4},
    'laurel': {'model.residual': 'laurel', 'model.laurel': 'rw_lr'},
    'resformer': {'model.value_residual': 'resformer'},
    'parallel_gptj': {'model.parallel_block': 'gptj'},
}


def get_config(arg: str | None = None):
  del arg
  c = default_config()  # seq_len 128, batch 16
  c.train.steps = 300
  c.train.log_every = 25
  c.train.eval_every = 150
  c.train.checkpoint_every = 150
  c.optim.warmup_steps = 30
  return c


def get_ladder(arg: str | None = None):
  names = arg.split(',') if arg else list(DESIGNS)
  unknown = [n for n in names if n not in DESIGNS]
  if unknown:
    raise ConfigError(f'--config argument {",".join(unknown)!r} is invalid: allowed a '
                      f'comma-separated subset of {", ".join(DESIGNS)}')
  return cross({n: DESIGNS[n] for n in names}, budget_sweep(BUDGET, DEPTHS, head_dim=16))
