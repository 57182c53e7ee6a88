"""Command line: python -m depthscale.main --config=experiments/FILE.py[:ARG] --workdir=DIR
[--config.SECTION.FIELD=VALUE ...] [--rung=NAME_OR_INDEX] [--allow_config_change] [--verbose]
[--nocompilation_cache]
[--dry_run [--topology=v5p-64 [--num_slices=N] [--smallest_slice]
           | --topology=h100-8 [--num_nodes=N]]
[--dry_run_json=PATH [--dry_run_resume]]]
[--coordinator_address=HOST:PORT --num_processes=N --process_id=I | --multi_host].

Exit codes: 0 finished (or preempted by SIGTERM after a checkpoint), 2 bad input (one line
naming the field; nothing written), 3 non-finite loss or gradient (one line naming the step,
the first non-finite block and the last good checkpoint), 4 the watchdog fired, 5 a
checkpoint or log could not be written, the store did not answer within its deadline
($DEPTHSCALE_STORAGE_DEADLINE), or a SIGTERM could not end the run cleanly within 25 s (one
line naming the step or file, the cause and the last complete checkpoint, which stays
usable)."""

from __future__ import annotations

import os
import sys
import threading
import traceback

from absl import app, flags, logging
from ml_collections import config_flags

from depthscale import storage
from depthscale.errors import ConfigError, WriteError, reason
from depthscale.experiment import check_flags, dry_run, run_ladder
from depthscale.training import distributed, topology
from depthscale.training.loop import NonFiniteError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment file[:arg].', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Ladder directory; rung r lives in WORKDIR/r/.')
_RUNG = flags.DEFINE_string('rung', None, 'Run only this rung (name or 0-based index).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Compile every rung for the mesh and report '
                             'parameters, per-device memory and shardings; no training.')
_TOPOLOGY = flags.DEFINE_string('topology', None, 'With --dry_run: compile for this TPU slice '
                                '(v5p-64, v5e-256, v4-128, v6e-16, ...; needs libtpu, no TPU) '
                                'or node of 8 GPUs (h100-8, h200-8, a100-80g-8, b200-8; needs '
                                'the gpu extra, no GPU).')
_NUM_SLICES = flags.DEFINE_integer('num_slices', 1, 'With a TPU --topology: slices of it joined '
                                   'over DCN (mesh.dcn_data defaults to this).')
_NUM_NODES = flags.DEFINE_integer('num_nodes', 1, 'With a GPU --topology: nodes of it (the mesh '
                                  'spans all their GPUs).')
_DRY_RUN_JSON = flags.DEFINE_string('dry_run_json', None, 'With --dry_run: also write the '
                                    'table (one record per rung) to this JSON file.')
_DRY_RUN_RESUME = flags.DEFINE_bool('dry_run_resume', False, 'With --dry_run_json: keep the '
                                     'rungs an earlier, interrupted run of the same dry run '
                                     'wrote there and compile only the others.')
_SMALLEST = flags.DEFINE_bool('smallest_slice', False, 'With --dry_run and a TPU --topology: '
                              "also each rung's smallest slice of that generation it fits "
                              '(halving or doubling the slice; a compile per slice tried).')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'Multi-process: HOST:PORT of '
                                   'process 0 (with --num_processes and --process_id).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Multi-process: process count.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Multi-process: this process (0-based).')
_ALLOW_CHANGE = flags.DEFINE_bool('allow_config_change', False, 'Resume rungs whose config '
                                   'changed in fields that change the computed function or '
                                   'the data order (model, optim, data, seeds); the change '
                                   'is kept in config_history.jsonl.')
_CACHE = flags.DEFINE_bool('compilation_cache', True, "The rungs share compiled programs "
                           'through a JAX compilation cache in WORKDIR/.jax_cache (local '
                           'workdirs; JAX_COMPILATION_CACHE_DIR names another); '
                           '--nocompilation_cache: none, and oneDNN dots on x86 CPUs.')
_VERBOSE = flags.DEFINE_bool('verbose', False, 'Print the traceback of errors that otherwise '
                             'end in one line.')
_MULTI_HOST = flags.DEFINE_bool('multi_host', False, 'Call jax.distributed.initialize() with '
                                'cluster auto-detection (TPU pod, SLURM) even if the '
                                'environment does not show a multi-process launch.')


def _usage_error(message: str, code: int = 2) -> None:
  if flags.FLAGS.is_parsed() and _VERBOSE.value:
    traceback.print_exc()
  print(f'error: {message}', file=sys.stderr)
  sys.exit(code)


def _unknown_field(argv: list[str]) -> str | None:
  """The error of the first --config.KEY flag that is not a field of the experiment's config
  (naming the fields of its section), None where every one is."""
  config_arg = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), None)
  keys = [a[len('--config.'):].split('=', 1)[0] for a in argv if a.startswith('--config.')]
  if config_arg is None or not keys:
    return None
  try:
    check_flags(config_arg, keys)
  except ConfigError as e:
    return str(e)
  return None


def _parse(argv: list[str]) -> list[str]:
  """absl parsing with one-line errors and exit code 2 for bad flags or overrides."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as e:
    _usage_error(_unknown_field(argv) or str(e).strip().splitlines()[-1])


_warned: set[str] = set()


def _background_warning(where: str, e: BaseException) -> None:
  """One line per distinct background failure (its traceback with --verbose); the failure
  that ends the run, such as a failed save, is reported by the run itself."""
  line = f'warning: {where} failed: {reason(e)}'
  if line not in _warned:
    _warned.add(line)
    print(line, file=sys.stderr, flush=True)


def _thread_failed(args: threading.ExceptHookArgs) -> None:
  _background_warning(args.thread.name if args.thread else 'a background thread',
                      args.exc_value)


def _callback_failed(args) -> None:
  """sys.unraisablehook: native threads print a failed callback through it (tensorstore's
  futures calling back into orbax's closed asyncio loop once a save has failed)."""
  _background_warning('a background callback', args.exc_value)


def main(argv: list[str]) -> None:
  # orbax and the file systems log each save at INFO, and each retry and background failure
  # with tracebacks; the run reports a failure in one line (--verbose shows their logs)
  logging.set_verbosity(logging.WARNING if _VERBOSE.value else logging.FATAL)
  if not _VERBOSE.value:
    threading.excepthook = _thread_failed
    sys.unraisablehook = _callback_failed
  if len(argv) > 1:
    _usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if _CONFIG.value is None or not (_WORKDIR.value or _DRY_RUN.value):
    _usage_error('--config and --workdir are required (--workdir not with --dry_run)')
  if _COORDINATOR.value and (_NUM_PROCESSES.value is None or _PROCESS_ID.value is None):
    _usage_error('--coordinator_address needs --num_processes and --process_id')
  if (_TOPOLOGY.value or _DRY_RUN_JSON.value or _SMALLEST.value) and not _DRY_RUN.value:
    _usage_error('--topology, --dry_run_json and --smallest_slice need --dry_run')
  if _DRY_RUN_RESUME.value and not _DRY_RUN_JSON.value:
    _usage_error('--dry_run_resume needs --dry_run_json')
  missing = _TOPOLOGY.value and topology.missing_compiler(_TOPOLOGY.value)
  if missing:
    _usage_error(missing)
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                         force=_MULTI_HOST.value)
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  config_arg = config_flags.get_config_filename(flags.FLAGS['config'])
  try:
    storage.check_bucket(_WORKDIR.value or '', '--workdir')
    storage.check_bucket(_DRY_RUN_JSON.value or '', '--dry_run_json')
    if _DRY_RUN.value:
      dry_run(config_arg, overrides, _RUNG.value, _TOPOLOGY.value, _NUM_SLICES.value,
              _DRY_RUN_JSON.value, num_nodes=_NUM_NODES.value, resume=_DRY_RUN_RESUME.value,
              smallest=_SMALLEST.value)
    else:
      run_ladder(config_arg, _WORKDIR.value, overrides, _RUNG.value, _ALLOW_CHANGE.value,
                 _CACHE.value)
  except ConfigError as e:
    _usage_error(str(e))
  except NonFiniteError as e:
    _usage_error(str(e), 3)
  except WriteError as e:
    if _VERBOSE.value:
      traceback.print_exc()
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(5)  # the failed save's threads may still retry: do not wait for them


if __name__ == '__main__':
  app.run(main, flags_parser=_parse)
