"""TensorBoard event files without torch: scalars, text and ready-made summaries.

torch's SummaryWriter imports torch (seconds) even to write a scalar; the report and download stages
need only scalars, text and PNGs, so the tracker writes TensorBoard's own protocol buffers, in the same
format SummaryWriter produces (`simple_value` scalars, the text plugin's string tensors under
`<tag>/text_summary`).

The records are framed here (TFRecord: length, masked CRC32C of the length, event, masked CRC32C of the event)
instead of by TensorBoard's EventFileWriter: that one computes CRC32C in pure Python on a thread of its own
behind a queue of 10, and a training loop handing it a window of step metrics waited on it for every scalar
(`python -m benchmarks.logging_cost`). google-crc32c computes it in C: a few µs a scalar,
written synchronously into a buffer that `flush()` (the tracker's, every 10 s) and `close()` empty.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import google_crc32c
from tensorboard.compat.proto.event_pb2 import Event, TaggedRunMetadata
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams.api_pb2 import (
    DATA_TYPE_BOOL,
    DATA_TYPE_FLOAT64,
    DATA_TYPE_STRING,
    STATUS_SUCCESS,
    Experiment,
    HParamInfo,
    MetricInfo,
    MetricName,
)
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo, SessionStartInfo
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

_FILE_NUMBERS = itertools.count()
WRITE_BUFFER_BYTES = 1 << 16


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC32C (Castagnoli), rotated right by 15 bits plus a constant."""
    crc = int(google_crc32c.value(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventWriter:
    """One event file in `logdir` (a TensorBoard run folder)."""

    def __init__(self, logdir: Path, suffix: str = "lab") -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        # EventFileWriter's name, plus a suffix of ours: torch's SummaryWriter may open a file in the same folder
        # in the same second (add_graph), and its counter is not this one. TensorBoard reads every `*tfevents*`.
        number = next(_FILE_NUMBERS)
        name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}.{number}.{suffix}"
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


HParam = int | float | str | bool
# The HParams plugin's value types (torch's SummaryWriter.add_hparams writes the same, from these Python types).
HPARAM_TYPES = {bool: DATA_TYPE_BOOL, int: DATA_TYPE_FLOAT64, float: DATA_TYPE_FLOAT64, str: DATA_TYPE_STRING}


def _hparams_summary(tag: str, data: HParamsPluginData) -> Summary:
    data.version = hparams_metadata.PLUGIN_DATA_VERSION
    return Summary(value=[Summary.Value(tag=tag, metadata=hparams_metadata.create_summary_metadata(data))])


def hparams_session(hparams: Mapping[str, HParam]) -> list[Summary]:
    """One HParams session (a row of the HParams table) in a run's folder: its hparams, started and ended.

    No experiment summary beside it: the HParams plugin takes the first experiment summary it finds as the
    columns of the whole log directory, so one per run showed only the columns of whichever run it met first
    (`--logdir runs` listed the profile's batch size, device and mode, not the train run's `train.lr`). The
    columns come from `hparams_experiment` in the log directory's own `hparams/` folder instead."""
    start = SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value = value
        elif isinstance(value, str):
            start.hparams[name].string_value = value
        else:
            start.hparams[name].number_value = float(value)
    end = SessionEndInfo(status=STATUS_SUCCESS, end_time_secs=time.time())
    return [
        _hparams_summary(hparams_metadata.SESSION_START_INFO_TAG, HParamsPluginData(session_start_info=start)),
        _hparams_summary(hparams_metadata.SESSION_END_INFO_TAG, HParamsPluginData(session_end_info=end)),
    ]


def hparams_experiment(hparams: Mapping[str, type], metrics: Sequence[str], shown: Sequence[str] = ()) -> Summary:
    """The HParams table's columns for a whole log directory: `hparams` (name -> Python type) and the scalar tags
    `metrics` whose values the sessions logged. TensorBoard lists the hparams it is told `differs` first, by name,
    and shows the first five as columns (the rest one tick away): `shown` are marked so."""
    experiment = Experiment(
        hparam_infos=[
            HParamInfo(name=name, type=HPARAM_TYPES[kind], differs=name in shown) for name, kind in hparams.items()
        ],
        metric_infos=[MetricInfo(name=MetricName(tag=tag)) for tag in metrics],
    )
    return _hparams_summary(hparams_metadata.EXPERIMENT_TAG, HParamsPluginData(experiment=experiment))


def scalars_layout(category: str, charts: Mapping[str, Sequence[str]]) -> Summary:
    """TensorBoard's Custom Scalars tab: in `category`, one chart per title that draws the scalars whose tags match
    its regular expressions, of every run, on one set of axes (the Scalars tab draws each tag on a card of its own,
    so a train curve and its test curve are never overlaid there). What tf.summary's custom_scalar `pb` writes,
    without TensorFlow."""
    layout = layout_pb2.Layout(
        category=[
            layout_pb2.Category(
                title=category,
                chart=[
                    layout_pb2.Chart(title=title, multiline=layout_pb2.MultilineChartContent(tag=list(tags)))
                    for title, tags in charts.items()
                ],
            )
        ]
    )
    tensor = TensorProto(dtype="DT_STRING", string_val=[layout.SerializeToString()], tensor_shape=TensorShapeProto())
    tag, metadata = custom_scalar_metadata.CONFIG_SUMMARY_TAG, custom_scalar_metadata.create_summary_metadata()
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour type -> channels, the `colorspace` of TensorBoard's Image summary (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


def png_header(png: bytes) -> tuple[int, int, int]:
    """Width, height and channels from a PNG's IHDR chunk (always the first, at a fixed offset)."""
    if png[:8] != PNG_SIGNATURE or png[12:16] != b"IHDR":
        raise ValueError("not a PNG file (no PNG signature and IHDR chunk at its start)")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    return width, height, _PNG_CHANNELS.get(png[25], 3)
