"""python -m depthscale.launch --config=FILE[:ARG] --workdir=DIR [--rung=NAME_OR_INDEX]
[--config.SECTION.FIELD=VALUE ...] [--allow_config_change] [--verbose]

Runs the ladder's rungs on the Ray cluster that RAY_ADDRESS names (`ray job submit --
python -m depthscale.launch ...` sets it), or on a local Ray instance started for the run:
each rung is `python -m depthscale.main ... --rung=NAME` in a Ray task with the resources of
its config's launch section, started once the rungs it needs have ended, retried after a
lost node or a killed process (resuming from its checkpoint). Prints one line per rung state
change, then the ladder's table and one status line per rung; each rung's output is kept in
DIR/<rung>/launch.log. Exit codes: 0 every rung finished, 1 a rung failed or was stopped,
2 bad input (one line naming the field; no rung started). SIGINT or SIGTERM: the running
rungs checkpoint and stop; the same command again skips finished rungs and resumes the rest.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from depthscale import main as main_cli
from depthscale import storage
from depthscale.errors import ConfigError
from depthscale.experiment import prepare
from depthscale.launch import cluster, plan
from depthscale.launch.runner import Launcher
from depthscale.results.report import rung_row, table
from depthscale.training.preflight import check_inputs

ONLY_MAIN = ('dry_run', 'topology', 'dry_run_json', 'dry_run_resume', 'smallest_slice',
             'coordinator_address', 'num_processes', 'process_id', 'multi_host')
NEEDS_RAY = 'error: python -m depthscale.launch needs Ray: pip install -e ".[ray]"'


def child_argv(argv: list[str]) -> list[str]:
  """depthscale.main's flags of this launch for every rung: the command line less --rung."""
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a in ('--rung', '-rung'):
      skip = True
    elif not a.startswith(('--rung=', '-rung=')):
      out.append(a)
  return out


def _on_local_devices(la) -> bool:
  return la.hosts == 1 and not la.tpu and not la.gpus


def main(argv: list[str]) -> None:
  f = flags.FLAGS
  logging.set_verbosity(logging.WARNING if f.verbose else logging.FATAL)
  given = [n for n in ONLY_MAIN if f[n].present]
  if given:
    main_cli._usage_error(f'--{given[0]} is a flag of depthscale.main only')  # pylint: disable=protected-access
  if len(argv) > 1:
    main_cli._usage_error(f'unexpected arguments: {" ".join(argv[1:])}')  # pylint: disable=protected-access
  if f.config is None or not f.workdir:
    main_cli._usage_error('--config and --workdir are required')  # pylint: disable=protected-access
  address = os.environ.get('RAY_ADDRESS') or None
  overrides = config_flags.get_override_values(f['config'])
  config_arg = config_flags.get_config_filename(f['config'])
  try:
    storage.check_bucket(f.workdir, '--workdir')
    resolved = prepare(config_arg, f.workdir, overrides, f.rung, check_machine=False)
    if not address:  # the rungs run on this host: check their data and meshes here
      for _, cfg in resolved:
        if _on_local_devices(cfg.launch):
          check_inputs(cfg)
    tasks = plan.tasks(resolved)
    ray, dashboard = cluster.connect(address)
    if address:
      cluster.check_shared(ray, f.workdir)
    cluster.check_fits(ray, tasks)
  except ConfigError as e:
    main_cli._usage_error(str(e))  # pylint: disable=protected-access
  n = len(cluster.nodes(ray))
  print(f'launch: {len(tasks)} rungs on the Ray cluster {address or "started here"} '
        f'({n} node{"s" if n != 1 else ""}; dashboard {dashboard or "off"})', flush=True)
  states = Launcher(ray, tasks, f.workdir, child_argv(sys.argv[1:])).run()
  configs = {r.name: cfg for r, cfg in resolved}
  rows = [rung_row(n, configs[n], storage.read_json(storage.join(f.workdir, n, 'summary.json')))
          for n, s in states.items() if plan.done(f.workdir, n, s.task.steps) == 'finished']
  print(table(rows), flush=True)
  for name, s in states.items():
    print(f'rung {name}: {s.state}' + (f' ({s.why})' if s.why else '')
          + (f', {s.attempts} attempts' if s.attempts > 1 else ''), flush=True)
  ray.shutdown()
  sys.exit(0 if all(s.state == 'finished' for s in states.values()) else 1)


if __name__ == '__main__':
  try:
    import ray  # pylint: disable=unused-import
  except ImportError:
    print(NEEDS_RAY, file=sys.stderr)
    sys.exit(2)
  app.run(main, flags_parser=main_cli._parse)  # pylint: disable=protected-access
