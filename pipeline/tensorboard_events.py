"""TensorBoard event files without torch: scalars, text and ready-made summaries.

torch's SummaryWriter imports torch (~4 s) even to write a scalar; the report and download stages
need only scalars and text, so the tracker writes through TensorBoard's own EventFileWriter and
protocol buffers, in the same format SummaryWriter produces (`simple_value` scalars, the text
plugin's string tensors under `<tag>/text_summary`).
"""

from __future__ import annotations

import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class EventWriter:
    """One event file in `logdir` (a TensorBoard run folder)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self._file = EventFileWriter(str(logdir))

    def add_summary(self, summary: Summary, step: int = 0) -> None:
        self._file.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def add_scalar(self, tag: str, value: float, step: int = 0) -> None:
        self.add_summary(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def add_text(self, tag: str, text: str, step: int = 0) -> None:
        """Markdown in the Text tab (fenced blocks keep tables fixed-width)."""
        metadata = SummaryMetadata(
            plugin_data=SummaryMetadata.PluginData(
                plugin_name="text", content=TextPluginData(version=0).SerializeToString()
            )
        )
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        self.add_summary(
            Summary(value=[Summary.Value(tag=f"{tag}/text_summary", metadata=metadata, tensor=tensor)]), step
        )

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
