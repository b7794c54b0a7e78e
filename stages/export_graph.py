"""DVC stage `export_graph`: the trained model's dataflow graph in TensorBoard, .pt2, ONNX, a summary and a picture."""

from pipeline.common.allocator import tune_allocator
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import DATA_ROOT, GRAPH_ONNX, GRAPH_PT2, GRAPH_SVG, MODEL_CHECKPOINT
from pipeline.common.stage_runner import run_stage_process
from pipeline.data.mnist import load_split
from pipeline.data.tensors import normalize_images
from pipeline.graph.artifacts import export_graph, log_graph_export
from pipeline.model.checkpoint import checkpoint_digest, load_checkpoint
from pipeline.params.loading import load_params
from pipeline.params.schema import section_as_dict
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.tags import DATA_DIGEST_TAG, MODEL_DIGEST_TAG


def main() -> None:
    tune_allocator()  # before any tensor: pipeline.common.allocator says why
    params = load_params()
    config = params.graph
    checkpoint = load_checkpoint(MODEL_CHECKPOINT)
    test_images, _ = load_split(DATA_ROOT, "test")
    images = normalize_images(test_images[: max(config.check_batch_sizes)])  # real images for the parity checks

    with open_tracker("export_graph", params.tracking) as tracker, AtomicOutputs() as outputs:
        tracker.log_params(section_as_dict(config), prefix="graph.")
        digest = checkpoint_digest(MODEL_CHECKPOINT)
        tracker.set_tags({DATA_DIGEST_TAG: checkpoint.data_digest, MODEL_DIGEST_TAG: digest})
        tracker.link_training(digest)
        result = export_graph(checkpoint.model, images, config, outputs)
        log_graph_export(tracker, checkpoint.model, images[:1], result, outputs)
    summary = result.summary
    print(
        f"{summary.total_parameters:,} parameters, {summary.forward_flops_per_sample:,} forward FLOPs per sample; "
        f"exported {GRAPH_PT2} and {GRAPH_ONNX} (batch sizes {list(config.check_batch_sizes)} checked, "
        f"max |difference| {result.worst_difference:.2g}); picture {GRAPH_SVG}"
    )


if __name__ == "__main__":
    run_stage_process("export_graph", main)
