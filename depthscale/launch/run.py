"""run_ladder: python -m depthscale.launch from Python (a notebook's ladder in parallel)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from depthscale import storage
from depthscale.experiment import resolve
from depthscale.launch.plan import done
from depthscale.results.report import rung_row


def run_ladder(config_arg: str, workdir: str, overrides: dict[str, Any] | None = None,
               rung: str | None = None) -> list[dict]:
  """experiment.run_ladder's counterpart on a Ray cluster (a notebook's ladder in parallel):
  runs `python -m depthscale.launch` on RAY_ADDRESS's cluster or a local instance, printing
  its lines as they come, and returns the table rows of the rungs. RuntimeError if one did
  not finish."""
  args = [f'--config={config_arg}', f'--workdir={workdir}'] + [
      f'--config.{k}={v}' for k, v in (overrides or {}).items()] + ([f'--rung={rung}'] if rung else [])
  with subprocess.Popen([sys.executable, '-m', 'depthscale.launch', *args], text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
    for line in proc.stdout:
      print(line, end='', flush=True)
  if proc.returncode:
    raise RuntimeError(f'python -m depthscale.launch {" ".join(args)} exited {proc.returncode}')
  return [rung_row(r.name, cfg, storage.read_json(storage.join(workdir, r.name, 'summary.json')))
          for r, cfg in resolve(config_arg, overrides, rung, check_machine=False)
          if done(workdir, r.name, cfg.train.steps) == 'finished']
