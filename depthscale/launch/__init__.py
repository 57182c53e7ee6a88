"""Ladders on a Ray cluster: every rung a Ray task (or a gang of them, one per host), run as
far in parallel as the cluster's resources allow, in the order of their needs, retried after
a lost node or a killed process (`python -m depthscale.launch`, the flags of depthscale.main).

plan.py     what the launcher schedules: each rung's needs, resources and state on disk
cluster.py  Ray: connect or start, check what the rungs ask for and the workdir's reach
attempt.py  one try of one rung: its processes placed (a task, a gang, a TPU slice)
host.py     what runs on a node: one rung process, its output streamed back, stopped on cancel
monitor.py  the launcher's mailbox on the cluster (start and output reports)
runner.py   the scheduling loop: start, watch, retry, stop
run.py      run_ladder: the same from Python (notebooks)

The package imports nothing at its start: the rungs' Ray workers import it (host.py,
monitor.py) and need no JAX; `depthscale.launch.run_ladder` loads run.py when first used.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
  """`depthscale.launch.run_ladder` (run.py's), imported on first use."""
  if name == 'run_ladder':
    return importlib.import_module('depthscale.launch.run').run_ladder
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
