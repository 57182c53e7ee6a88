"""Checkpoints: orbax CheckpointManager (async) holding the train state and the data
iterator state, keeping the last k; restore falls back past unreadable ones; a save that
fails in the background raises WriteError at the next check. In a bucket every call into
orbax, and every wait on its background threads, is bounded by storage.deadline()."""

from __future__ import annotations

import contextlib
import json
import logging
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from depthscale import storage
from depthscale.errors import ConfigError, StoreTimeout, WriteError, reason
from depthscale.training import sharding

CORRUPT_PREFIX = 'corrupt-'  # unreadable step directories are renamed corrupt-<step>-<n>
KEPT_WAIT_S = 2.0  # how long an error report waits to learn whether the last save completed


class UnreadableCheckpoints(ConfigError):
  """Checkpoints exist but none of them can be restored."""


class CheckpointError(WriteError):
  """A checkpoint could not be saved, or read in time; the message says where a rerun
  resumes."""


class Checkpointer:
  """Saves and restores {'state': train state, 'data': iterator state} by step."""

  def __init__(self, directory: str, keep: int):
    self.directory = storage.absolute(directory)
    self._step: int | None = None  # the step of the save in flight (or the last one)
    self._complete: int | None = None  # the newest step known to be saved completely
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           create=True)
    with _quiet_absl():  # it reads every step's metadata; restore_latest reports damage
      self._mngr = self._bounded('opened', lambda: ocp.CheckpointManager(
          self.directory, options=options, item_names=('state', 'data')))

  def _bounded(self, doing: str, fn):
    """fn(), a call into orbax, within the store's deadline (storage.bounded)."""
    return storage.bounded(self.directory, doing, fn)

  def kept(self) -> str:
    """Where a rerun resumes, as far as this run knows it (it asks orbax, not the store, for
    at most KEPT_WAIT_S whether the save in flight has completed)."""
    if self._step is not None and self._step != self._complete:
      with contextlib.suppress(Exception):  # failed or not answering: what is known stands
        if storage.bounded(self.directory, 'checked', self._finished, seconds=KEPT_WAIT_S):
          self._complete = self._step
    if self._complete is None:
      return f'no checkpoint in {self.directory} is known complete'
    return (f'the last complete checkpoint is step {self._complete} in {self.directory}: '
            'rerun to resume from it')

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, step: int, state, data_state) -> None:
    """Starts an async save (after the previous one finished); data_state must be
    JSON-serializable."""
    data = json.loads(json.dumps(data_state, default=_jsonable))
    self.wait()
    self._step = step
    with self._saving():
      self._bounded(f'saved at step {step}', lambda: self._mngr.save(
          step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        data=ocp.args.JsonSave(data))))

  def check(self) -> None:
    """Raises WriteError if the background save failed, and notes when it has completed
    (cheap: call it every step)."""
    if self._step is None or self._step == self._complete:  # nothing in flight
      return
    with self._saving():
      if self._bounded(f'saved at step {self._step}', self._finished):
        self._complete = self._step

  def _finished(self) -> bool:
    """Whether the save in flight has completed; raises its error if it failed."""
    done = not self._mngr.is_saving_in_progress()  # read first: then no error means done
    self._mngr.check_for_errors()
    return done

  @contextlib.contextmanager
  def _saving(self):
    """Turns a failure of the save in flight into WriteError naming its step."""
    try:
      yield
    except Exception as e:  # orbax, tensorstore and the file systems raise many types
      why = f': {e.cause}' if isinstance(e, StoreTimeout) else f' ({reason(e)})'
      raise CheckpointError(f'checkpoint at step {self._step} could not be saved in '
                            f'{self.directory}{why}; {self.kept()}') from e

  def restore(self, step: int, abstract_state):
    """(state, data_state) of a step; abstract_state gives shapes, dtypes, shardings."""
    out = self._bounded(f'read at step {step}', lambda: self._mngr.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                      data=ocp.args.JsonRestore())))
    # Fresh device buffers for the donating train step (on CPU, restored buffers may alias
    # host memory owned by orbax).
    return sharding.owned_copy(out.state), out.data

  def restore_latest(self, abstract_state) -> tuple[int, object, object] | None:
    """(step, state, data_state) of the newest readable checkpoint, or None if there is none.

    An unreadable newer one (truncated files, a missing shard, broken metadata) is moved
    aside to corrupt-<step>-<n> (never deleted) with a one-line warning once an older one
    restores; if none restores, raises UnreadableCheckpoints and moves nothing. A store that
    does not answer in time raises CheckpointError and moves nothing.
    """
    failed: list[tuple[int, str]] = []
    for step in sorted(self._mngr.all_steps(), reverse=True):
      try:
        with _quiet_absl():
          state, data_state = self.restore(step, abstract_state)
        why = None
      except StoreTimeout as e:  # not damage: the checkpoint stays where it is
        raise CheckpointError(f'checkpoint {e}; nothing was moved: rerun to resume from the '
                              'latest checkpoint') from None
      except Exception as e:  # orbax and tensorstore raise many types for damaged files
        why = reason(e)
      if _everywhere(why is None):
        self._move_aside(failed, step)
        self._complete = step
        return step, state, data_state
      failed.append((step, why or 'unreadable on another process'))
    if failed:
      raise UnreadableCheckpoints(
          f'{self.directory} holds no readable checkpoint (' + '; '.join(
              f'step {s}: {r}' for s, r in failed) + '): allowed a checkpoints directory '
          'with one intact step; move it aside to start the rung over')
    return None

  def _move_aside(self, failed: list[tuple[int, str]], restored: int) -> None:
    """Renames unreadable step directories to corrupt-<step>-<n>, outside orbax's step
    names, so that orbax no longer sees them."""
    if not failed:
      return
    if jax.process_index() == 0:
      for step, why in failed:
        n = 0
        while storage.exists(self._aside(step, n)):
          n += 1
        storage.rename(storage.join(self.directory, str(step)), self._aside(step, n))
        print(f'warning: checkpoint at step {step} is unreadable ({why}); moved to '
              f'{self._aside(step, n)}, resuming from step {restored}', file=sys.stderr,
              flush=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('depthscale: unreadable checkpoints moved aside')
    self._bounded('listed', self._mngr.reload)

  def _aside(self, step: int, n: int) -> str:
    return storage.join(self.directory, f'{CORRUPT_PREFIX}{step}-{n}')

  def wait(self) -> None:
    """Waits for the save in flight (at most the store's deadline)."""
    with self._saving():
      self._bounded(f'saved at step {self._step}', self._mngr.wait_until_finished)
    if self._step is not None:
      self._complete = self._step

  def close(self) -> None:
    self.wait()
    self._bounded('closed', self._mngr.close)


@contextlib.contextmanager
def _quiet_absl():
  """Silences orbax's absl log lines about damaged files (the caller reports in one line)."""
  logger = logging.getLogger('absl')
  level = logger.level
  logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    logger.setLevel(level)


def _everywhere(ok: bool) -> bool:
  """True if ok holds on every process (the processes must agree on the step restored)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.asarray(ok))))


def _jsonable(x):
  if isinstance(x, bytes):
    return x.decode('latin-1')
  if hasattr(x, 'tolist'):
    return x.tolist()
  raise TypeError(f'data iterator state holds a non-JSON value of type {type(x).__name__}')


def abstract(tree):
  """Shape/dtype/sharding skeleton of a pytree of arrays, for restoring."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
