"""Checkpoints: orbax CheckpointManager (async) holding the train state and the data
iterator state, keeping the last k."""

from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores {'state': train state, 'data': iterator state} by step."""

  def __init__(self, directory: str, keep: int):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=True,
                                           create=True)
    self._mngr = ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                       item_names=('state', 'data'))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, step: int, state, data_state) -> None:
    """Starts an async save; data_state must be JSON-serializable."""
    data = json.loads(json.dumps(data_state, default=_jsonable))
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data)))

  def restore(self, step: int, abstract_state):
    """(state, data_state) of a step; abstract_state gives shapes, dtypes, shardings."""
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    # Fresh device buffers for the donating train step (on CPU, restored buffers may alias
    # host memory owned by orbax).
    return jax.tree.map(lambda x: x.copy(), out.state), out.data

  def wait(self) -> None:
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()


def _jsonable(x):
  if isinstance(x, bytes):
    return x.decode('latin-1')
  if hasattr(x, 'tolist'):
    return x.tolist()
  raise TypeError(f'data iterator state holds a non-JSON value of type {type(x).__name__}')


def abstract(tree):
  """Shape/dtype/sharding skeleton of a pytree of arrays, for restoring."""
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
