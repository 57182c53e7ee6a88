"""Output writers of a rung: TensorBoard events (tensorboard's own writer, no TF) and JSONL."""

from __future__ import annotations

import json
import os
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.proto.event_pb2 import SessionLog
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from depthscale import atomic


class TensorBoard:
  """Writes scalar and PNG image summaries to an event file in logdir.

  The first event is a SessionLog START at start_step: TensorBoard then discards the points
  at or after that step from earlier event files (those a killed run wrote past its last
  checkpoint), so a resumed run shows one curve.
  """

  def __init__(self, logdir: str, start_step: int = 0):
    self._writer = EventFileWriter(logdir)
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(start_step),
                                           session_log=SessionLog(status=SessionLog.START)))

  def _add(self, step: int, value: summary_pb2.Summary.Value) -> None:
    event = event_pb2.Event(wall_time=time.time(), step=int(step),
                            summary=summary_pb2.Summary(value=[value]))
    self._writer.add_event(event)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    for tag, v in values.items():
      self._add(step, summary_pb2.Summary.Value(tag=tag, simple_value=float(v)))

  def image(self, step: int, tag: str, png: bytes, height: int, width: int) -> None:
    img = summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                    encoded_image_string=png)
    self._add(step, summary_pb2.Summary.Value(tag=tag, image=img))

  def hparams(self, values: dict[str, bool | int | float | str]) -> None:
    """The run's hyperparameters (HParams dashboard), one session-start summary."""
    summary = hparams_summary.hparams_pb(values)
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary))

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class Jsonl:
  """Appends one JSON object per line; on resume drops records at or after a step (and a
  line torn by a kill), rewriting the file atomically."""

  def __init__(self, path: str, resume_step: int | None):
    self.path = path
    if resume_step is not None and os.path.exists(path):
      kept = [line for line in _lines(path) if json.loads(line)['step'] < resume_step]
      atomic.write_text(path, ''.join(kept))

  def write(self, record: dict) -> None:
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')


def _lines(path: str) -> list[str]:
  """The non-blank lines of a JSONL file, less an unterminated last line that does not
  parse (a write cut short by a kill)."""
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  if lines and not lines[-1].endswith('\n'):
    try:
      json.loads(lines[-1])
      lines[-1] += '\n'
    except json.JSONDecodeError:
      lines.pop()
  return lines


def read_jsonl(path: str) -> list[dict]:
  """All records of a JSONL file (see _lines)."""
  return [json.loads(line) for line in _lines(path)]
