"""What the export_graph stage writes (graph files, summary, metrics) and logs (MLflow, TensorBoard)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.common.numbers import significant
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import (
    GRAPH_DOT,
    GRAPH_METRICS,
    GRAPH_ONNX,
    GRAPH_PROGRAM,
    GRAPH_PT2,
    GRAPH_SVG,
    SUMMARY_CSV,
    SUMMARY_JSON,
    SUMMARY_MARKDOWN,
)
from pipeline.graph.export import (
    ParityCheck,
    add_tensorboard_graph,
    check_exported_program,
    check_onnx,
    export_onnx,
    export_program,
    program_text,
)
from pipeline.graph.picture import dataflow_dot, render_svg
from pipeline.model.network import LabNet
from pipeline.model.summary import ModelSummary, summarize, summary_csv, summary_markdown
from pipeline.params.schema import GraphConfig
from pipeline.tracking.tracker import Tracker

# Logged as MLflow artifacts under graph/ (the markdown summary is logged as text).
LOGGED_FILES = (GRAPH_PT2, GRAPH_PROGRAM, GRAPH_ONNX, SUMMARY_CSV, SUMMARY_JSON, GRAPH_DOT, GRAPH_SVG)


@dataclass(frozen=True)
class GraphExport:
    summary: ModelSummary
    parity: tuple[ParityCheck, ...]
    program_text: str
    summary_markdown: str

    def as_metrics(self) -> dict[str, float]:
        """`metrics/graph.json`: model size and cost, and the worst difference of each exported program over the
        checked batch sizes (2 digits: the stage already failed if it exceeds `graph.parity_atol`; per batch size
        in MLflow, `parity_metrics`). One number per program keeps `dvc metrics diff` free of 1e-6 float noise rows."""
        worst: dict[str, float] = {}
        for check in self.parity:
            key = f"{check.runtime.replace('.', '_')}_max_abs_difference"
            worst[key] = max(worst.get(key, 0.0), check.max_abs_difference)
        return {
            "total_parameters": self.summary.total_parameters,
            "forward_flops_per_sample": self.summary.forward_flops_per_sample,
            "training_flops_per_sample": self.summary.training_flops_per_sample,
            **{key: significant(value, 2) for key, value in worst.items()},
        }

    def parity_metrics(self) -> dict[str, float]:
        """Each exported program's difference at each checked batch size (MLflow; unrounded)."""
        return {
            f"{check.runtime.replace('.', '_')}_max_abs_difference_batch{check.batch_size}": check.max_abs_difference
            for check in self.parity
        }

    @property
    def worst_difference(self) -> float:
        return max((check.max_abs_difference for check in self.parity), default=0.0)


def export_graph(model: LabNet, images: torch.Tensor, config: GraphConfig, outputs: AtomicOutputs) -> GraphExport:
    """Export `model` to .pt2 and ONNX, check both against it on `images`, and stage every graph output."""
    program = export_program(model, outputs.staged(GRAPH_PT2))
    exported_text = program_text(program)
    outputs.write_text(GRAPH_PROGRAM, exported_text)
    export_onnx(model, outputs.staged(GRAPH_ONNX), config.onnx_opset)
    parity = check_exported_program(outputs.staged(GRAPH_PT2), model, images, config.check_batch_sizes)
    parity += check_onnx(outputs.staged(GRAPH_ONNX), model, images, config.check_batch_sizes, config.parity_atol)

    summary = summarize(model, model.input_shape)
    markdown = summary_markdown(summary)
    outputs.write_text(SUMMARY_MARKDOWN, markdown)
    outputs.write_text(SUMMARY_CSV, summary_csv(summary))
    outputs.write_json(SUMMARY_JSON, summary.as_dict())
    dot = dataflow_dot(program, type(model).__name__)
    outputs.write_text(GRAPH_DOT, dot)
    outputs.staged(GRAPH_SVG).write_bytes(render_svg(dot))
    result = GraphExport(summary, tuple(parity), exported_text, markdown)
    outputs.write_json(GRAPH_METRICS, result.as_metrics())
    return result


def log_graph_export(
    tracker: Tracker, model: LabNet, example: torch.Tensor, result: GraphExport, outputs: AtomicOutputs
) -> None:
    add_tensorboard_graph(tracker, model, example)
    tracker.log_summary({**result.as_metrics(), **result.parity_metrics()}, prefix="graph/")
    tracker.log_text("graph/summary", result.summary_markdown, "summary.md")
    tracker.log_text("graph/exported_program", f"```\n{result.program_text}\n```")
    for path in LOGGED_FILES:
        tracker.log_artifact(outputs.staged(path), "graph")
