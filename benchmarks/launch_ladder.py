"""The launcher benchmark's ladders (benchmarks/launch_throughput.py), eight rungs each.

get_ladder(None): quickstart-size rungs (d_model 64, T 128, batch 16, 150 steps;
depthscale.experiment.small_config), four norm placements at depths 2 and 4.
get_ladder('survey'): the method survey's first eight stage-1 rungs at its cpu size (L 8,
d 32, T 64, batch 8, 300 steps on python_docs; experiments/method_survey.py), the rungs the
claims table was measured on.
"""

import os

from depthscale.experiment import load_module, small_config
from depthscale.ladder import cross, depth_sweep

PLACEMENTS = ('pre_ln', 'post_ln', 'peri_ln', 'sandwich_ln')
SURVEY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'experiments', 'method_survey.py')


def get_config(arg: str | None = None):
  return load_module(SURVEY).get_config('cpu') if arg == 'survey' else small_config()


def get_ladder(arg: str | None = None):
  if arg == 'survey':
    return [r for r in load_module(SURVEY).get_ladder('cpu') if not r.needs][:8]
  return cross({p: {'model.block': p} for p in PLACEMENTS}, depth_sweep([2, 4]))
