"""Output writers of a rung: TensorBoard events (tensorboard's own record format, no TF) and
JSONL, both through storage.Appender: local files are written in place, bucket objects are
rewritten at each flush (see depthscale.storage)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import struct
import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.proto.event_pb2 import SessionLog
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.summary.writer.record_writer import RecordWriter
from tensorboard.util import tensor_util

from depthscale import storage

_FILE_IDS = itertools.count()  # event file names of one process stay distinct


class TensorBoard:
  """Writes scalar, PNG image, HParams and custom-scalars layout summaries to a new event
  file in logdir.

  The first event after the file version is a SessionLog START at start_step: TensorBoard
  then discards the points at or after that step from earlier event files (those a killed
  run wrote past its last checkpoint), so a resumed run shows one curve.
  """

  def __init__(self, logdir: str, start_step: int = 0):
    name = (f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.'
            f'{os.getpid()}.{next(_FILE_IDS)}')
    self.path = storage.join(logdir, name)
    self._file = storage.Appender(self.path)
    self._records = RecordWriter(self._file)
    self._add_event(event_pb2.Event(file_version='brain.Event:2'))
    self._add_event(event_pb2.Event(step=int(start_step),
                                    session_log=SessionLog(status=SessionLog.START)))

  def _add_event(self, event: event_pb2.Event) -> None:
    event.wall_time = time.time()
    self._records.write(event.SerializeToString())

  def _add(self, step: int, value: summary_pb2.Summary.Value) -> None:
    self._add_event(event_pb2.Event(step=int(step), summary=summary_pb2.Summary(value=[value])))

  def scalars(self, step: int, values: dict[str, float]) -> None:
    for tag, v in values.items():
      self._add(step, summary_pb2.Summary.Value(tag=tag, simple_value=float(v)))

  def image(self, step: int, tag: str, png: bytes) -> None:
    """A PNG image (its size read from its header)."""
    width, height = struct.unpack('>II', png[16:24])  # IHDR, the chunk every PNG starts with
    img = summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                    encoded_image_string=png)
    self._add(step, summary_pb2.Summary.Value(tag=tag, image=img))

  def hparams(self, values: dict[str, bool | int | float | str]) -> None:
    """The run's hyperparameters (HParams dashboard), one session-start summary."""
    self._add_event(event_pb2.Event(step=0, summary=hparams_summary.hparams_pb(values)))

  def layout(self, step: int, layout: layout_pb2.Layout) -> None:
    """The Custom Scalars dashboard's layout; TensorBoard shows a run's last one. The summary
    tensorboard's custom_scalar.summary.pb builds, without its TensorFlow import."""
    self._add(step, summary_pb2.Summary.Value(
        tag=custom_scalar_metadata.CONFIG_SUMMARY_TAG,
        metadata=custom_scalar_metadata.create_summary_metadata(),
        tensor=tensor_util.make_tensor_proto(layout.SerializeToString())))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class Jsonl:
  """Appends one JSON object per line; on resume drops records at or after a step (and a
  line torn by a kill), rewriting the file atomically."""

  def __init__(self, path: str, resume_step: int | None):
    self.path = path
    kept = [line for line in storage.jsonl_lines(path)
            if resume_step is None or json.loads(line)['step'] < resume_step]
    self._file = storage.Appender(path, ''.join(kept).encode())

  def write(self, record: dict) -> None:
    self._file.write((json.dumps(record) + '\n').encode())

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()
