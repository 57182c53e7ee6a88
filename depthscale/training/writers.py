"""Output writers of a rung: TensorBoard events (tensorboard's own writer, no TF) and JSONL."""

from __future__ import annotations

import json
import os
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class TensorBoard:
  """Writes scalar and PNG image summaries to an event file in logdir."""

  def __init__(self, logdir: str):
    self._writer = EventFileWriter(logdir)

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
  """Appends one JSON object per line; on resume drops records at or after a step."""

  def __init__(self, path: str, resume_step: int | None):
    self.path = path
    if resume_step is not None and os.path.exists(path):
      with open(path) as f:
        kept = [line for line in f if line.strip() and json.loads(line)['step'] < resume_step]
      with open(path, 'w') as f:
        f.writelines(kept)

  def write(self, record: dict) -> None:
    with open(self.path, 'a') as f:
      f.write(json.dumps(record) + '\n')


def read_jsonl(path: str) -> list[dict]:
  """All records of a JSONL file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
