"""The launcher's mailbox on the cluster (a Ray actor on the launcher's node): the rungs'
hosts report their start and output lines; a gang's host 0 publishes the jax.distributed
coordinator for the others."""

from __future__ import annotations


class Monitor:
  """Events in arrival order: ('start', key, node_ip, node_id, pid of the rung process) and
  ('lines', key, [line, ...]), with key = (rung, attempt, host)."""

  def __init__(self):
    self._events: list[tuple] = []
    self._coordinators: dict[tuple, str] = {}

  def started(self, key: tuple, node_ip: str, node_id: str, pid: int) -> None:
    self._events.append(('start', key, node_ip, node_id, pid))

  def lines(self, key: tuple, batch: list[str]) -> None:
    self._events.append(('lines', key, batch))

  def drain(self) -> list[tuple]:
    events, self._events = self._events, []
    return events

  def set_coordinator(self, gang: tuple, address: str) -> None:
    self._coordinators[gang] = address

  def coordinator(self, gang: tuple) -> str | None:
    return self._coordinators.get(gang)
