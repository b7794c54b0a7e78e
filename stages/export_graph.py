"""DVC stage `export_graph`: the trained model's dataflow graph in TensorBoard, .pt2, ONNX, a summary and a picture."""

from pipeline.atomic import AtomicOutputs
from pipeline.checkpoint import load_checkpoint
from pipeline.cli import run_stage
from pipeline.config import load_params, section_as_dict
from pipeline.data import load_split
from pipeline.graph_export import (
    add_tensorboard_graph,
    check_exported_program,
    check_onnx,
    export_onnx,
    export_program,
    program_text,
)
from pipeline.graph_picture import dataflow_dot, render_svg
from pipeline.model_summary import summarize, summary_csv, summary_markdown
from pipeline.paths import (
    DATA_ROOT,
    GRAPH_DOT,
    GRAPH_METRICS,
    GRAPH_ONNX,
    GRAPH_PROGRAM,
    GRAPH_PT2,
    GRAPH_SVG,
    MODEL_CHECKPOINT,
    SUMMARY_CSV,
    SUMMARY_JSON,
    SUMMARY_MARKDOWN,
)
from pipeline.tracking import open_tracker
from pipeline.training import normalize_images


def main() -> None:
    params = load_params()
    config = params.graph
    checkpoint = load_checkpoint(MODEL_CHECKPOINT)
    model = checkpoint.model
    test_images, _ = load_split(DATA_ROOT, "test")
    images = normalize_images(test_images[: max(config.check_batch_sizes)])
    summary = summarize(model, model.input_shape)

    with open_tracker("export_graph", params.tracking) as tracker, AtomicOutputs() as outputs:
        tracker.log_params({f"graph.{key}": value for key, value in section_as_dict(config).items()})
        tracker.set_tags({"data.digest": checkpoint.data_digest})
        add_tensorboard_graph(tracker.writer, model, images[:1])

        program = export_program(model, outputs.staged(GRAPH_PT2))
        exported_text = program_text(program)
        outputs.write_text(GRAPH_PROGRAM, exported_text)
        export_onnx(model, outputs.staged(GRAPH_ONNX), config.onnx_opset)
        parity = check_exported_program(outputs.staged(GRAPH_PT2), model, images, config.check_batch_sizes)
        parity += check_onnx(outputs.staged(GRAPH_ONNX), model, images, config.check_batch_sizes, config.parity_atol)

        markdown = summary_markdown(summary)
        outputs.write_text(SUMMARY_MARKDOWN, markdown)
        outputs.write_text(SUMMARY_CSV, summary_csv(summary))
        outputs.write_json(SUMMARY_JSON, summary.as_dict())
        dot = dataflow_dot(program, type(model).__name__)
        outputs.write_text(GRAPH_DOT, dot)
        outputs.staged(GRAPH_SVG).write_bytes(render_svg(dot))

        metrics = {
            "total_parameters": summary.total_parameters,
            "forward_flops_per_sample": summary.forward_flops_per_sample,
            "training_flops_per_sample": summary.training_flops_per_sample,
            **{f"{check.runtime.replace('.', '_')}_max_abs_difference_batch{check.batch_size}": check.max_abs_difference for check in parity},
        }
        outputs.write_json(GRAPH_METRICS, metrics)
        tracker.log_metrics(metrics)
        tracker.log_text("model/summary", markdown, "summary.md")
        tracker.writer.add_text("model/exported_program", f"```\n{exported_text}\n```", 0)
        for path in (GRAPH_PT2, GRAPH_PROGRAM, GRAPH_ONNX, SUMMARY_CSV, SUMMARY_JSON, GRAPH_DOT, GRAPH_SVG):
            tracker.log_artifact(outputs.staged(path), "graph")
    worst = max((check.max_abs_difference for check in parity), default=0.0)
    print(
        f"{summary.total_parameters:,} parameters, {summary.forward_flops_per_sample:,} forward FLOPs per sample; "
        f"exported {GRAPH_PT2} and {GRAPH_ONNX} (batch sizes {list(config.check_batch_sizes)} checked, "
        f"max |difference| {worst:.2g}); picture {GRAPH_SVG}"
    )


if __name__ == "__main__":
    run_stage("export_graph", main)
