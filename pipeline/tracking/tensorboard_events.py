"""TensorBoard event files without torch: scalars, text and ready-made summaries.

torch's SummaryWriter imports torch (~4 s) even to write a scalar; the report and download stages
need only scalars, text and PNGs, so the tracker writes TensorBoard's own protocol buffers, in the same
format SummaryWriter produces (`simple_value` scalars, the text plugin's string tensors under
`<tag>/text_summary`).

The records are framed here (TFRecord: length, masked CRC32C of the length, event, masked CRC32C of the event)
instead of by TensorBoard's EventFileWriter: that one computes CRC32C in pure Python on a thread of its own
behind a queue of 10, and a training loop handing it a window of step metrics waited ~125 µs a scalar
(AMD EPYC, 2 vCPUs; `python -m benchmarks.logging_cost`). google-crc32c computes it in C: a few µs a scalar,
written synchronously into a buffer that `flush()` (the tracker's, every 10 s) and `close()` empty.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path

import google_crc32c
from tensorboard.compat.proto.event_pb2 import Event, TaggedRunMetadata
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

_FILE_NUMBERS = itertools.count()
WRITE_BUFFER_BYTES = 1 << 16


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventWriter:
    """One event file in `logdir` (a TensorBoard run folder)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        # EventFileWriter's name, plus a suffix of ours: torch's SummaryWriter may open a file in the same folder
        # in the same second (add_graph), and its counter is not this one. TensorBoard reads every `*tfevents*`.
        name = (
            f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_NUMBERS)}.lab"
        )
        self._file = open(logdir / name, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115 (closed by close())
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _write(self, event: Event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._file.write(
            header + struct.pack("<I", _masked_crc32c(header)) + data + struct.pack("<I", _masked_crc32c(data))
        )

    def add_summary(self, summary: Summary, step: int = 0) -> None:
        self._write(Event(wall_time=time.time(), step=step, summary=summary))

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

    def add_png(self, tag: str, png: bytes, step: int = 0) -> None:
        """A PNG file's bytes in the Images tab as they are (no decode, no torch): the summary needs only
        the size and channel count, read from the PNG header."""
        width, height, channels = png_header(png)
        image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=png)
        self.add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def add_graph(self, graph_def: bytes, run_metadata: bytes) -> None:
        """TensorBoard's Graphs tab: a serialized GraphDef and its RunMetadata, as SummaryWriter.add_graph writes
        them (the graph, then the run metadata tagged `step1`)."""
        self._write(Event(wall_time=time.time(), graph_def=graph_def))
        tagged = TaggedRunMetadata(tag="step1", run_metadata=run_metadata)
        self._write(Event(wall_time=time.time(), tagged_run_metadata=tagged))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour type -> channels, the `colorspace` of TensorBoard's Image summary (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


def png_header(png: bytes) -> tuple[int, int, int]:
    """Width, height and channels from a PNG's IHDR chunk (always the first, at a fixed offset)."""
    if png[:8] != PNG_SIGNATURE or png[12:16] != b"IHDR":
        raise ValueError("not a PNG file (no PNG signature and IHDR chunk at its start)")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    return width, height, _PNG_CHANNELS.get(png[25], 3)
