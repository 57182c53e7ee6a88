"""Command line: python -m depthscale.main --config=experiments/FILE.py[:ARG] --workdir=DIR
[--config.SECTION.FIELD=VALUE ...] [--rung=NAME_OR_INDEX]."""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from depthscale.config import ConfigError

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment file[:arg].', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Ladder directory; rung r lives in WORKDIR/r/.')
_RUNG = flags.DEFINE_string('rung', None, 'Run only this rung (name or 0-based index).')


def _usage_error(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def _parse(argv: list[str]) -> list[str]:
  """absl parsing with one-line errors and exit code 2 for bad flags or overrides."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, KeyError, TypeError, ValueError, AttributeError) as e:
    _usage_error(str(e).strip().splitlines()[-1])


def main(argv: list[str]) -> None:
  from depthscale.experiment import run_ladder  # pylint: disable=import-outside-toplevel
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  if len(argv) > 1:
    _usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if not _WORKDIR.value or _CONFIG.value is None:
    _usage_error('--config and --workdir are required')
  overrides = config_flags.get_override_values(flags.FLAGS['config'])
  config_arg = config_flags.get_config_filename(flags.FLAGS['config'])
  try:
    run_ladder(config_arg, _WORKDIR.value, overrides, _RUNG.value)
  except ConfigError as e:
    _usage_error(str(e))


if __name__ == '__main__':
  app.run(main, flags_parser=_parse)
