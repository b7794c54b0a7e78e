"""DVC stage `profile@<batch>-<device>-<mode>`: time and profile one combination of the matrix.

    python -m stages.profile                       # under DVC: the combination is the stage's name
    python -m stages.profile BATCH_SIZE DEVICE MODE  # a direct run

DVC's command line holds no matrix value (see pipeline/matrix.py); every other setting comes from
params.yaml as usual.
"""

import sys
from dataclasses import asdict

import torch

from pipeline.atomic import AtomicOutputs
from pipeline.checkpoint import load_checkpoint
from pipeline.cli import run_stage
from pipeline.config import load_params
from pipeline.data import load_split
from pipeline.errors import PipelineError
from pipeline.matrix import profile_matrix_item
from pipeline.paths import DATA_ROOT, MODEL_CHECKPOINT, profile_outputs
from pipeline.profiling import Combination, OperatorRow, make_step, operators_markdown, profile_combination
from pipeline.runtime import hardware_description, select_device
from pipeline.tables import records_csv
from pipeline.tracking import open_tracker
from pipeline.training import MEMORY_FORMAT, normalize_images


def main() -> None:
    params = load_params()
    combination = Combination(*profile_matrix_item(params.profile, sys.argv[1:]))
    config = params.profile
    device = select_device(combination.device, param="profile.devices")
    if config.threads:
        torch.set_num_threads(config.threads)
    checkpoint = load_checkpoint(MODEL_CHECKPOINT)
    model = checkpoint.model.to(device=device, memory_format=MEMORY_FORMAT)
    test_images, test_labels = load_split(DATA_ROOT, "test")
    if combination.batch_size > len(test_labels):
        raise PipelineError(
            f"`profile.batch_sizes` has {combination.batch_size}, more than the {len(test_labels)} test images "
            "a batch is drawn from; use a smaller batch size."
        )
    images = normalize_images(test_images[: combination.batch_size], device).contiguous(memory_format=MEMORY_FORMAT)
    labels = torch.from_numpy(test_labels[: combination.batch_size].astype("int64")).to(device)
    paths = profile_outputs(combination.name)
    hardware = hardware_description(device)
    memory_format = str(MEMORY_FORMAT).removeprefix("torch.")

    with open_tracker("profile", params.tracking, variant=combination.name) as tracker, AtomicOutputs() as outputs:
        tracker.log_params(
            {
                **asdict(combination),
                "threads": torch.get_num_threads(),
                "precision": "fp32",
                "memory_format": memory_format,
                **{f"profile.{key}": getattr(config, key) for key in ("warmup_steps", "active_steps", "top_k")},
                **{f"hardware.{key}": value for key, value in hardware.items()},
            }
        )
        tracker.set_tags({"data.digest": checkpoint.data_digest, "combination": combination.name})
        step = make_step(model, combination.mode, images, labels)
        result = profile_combination(
            combination, step, device, config.warmup_steps, config.active_steps, outputs.staged(paths.trace)
        )
        top = result.operators[: config.top_k]
        on_gpu = device.type == "cuda"
        markdown = operators_markdown(result, top, on_gpu)
        metrics = result.timing_metrics()
        outputs.write_text(paths.table_markdown, markdown)
        outputs.write_text(paths.table_csv, records_csv(OperatorRow, top))
        settings = {"threads": torch.get_num_threads(), "precision": "fp32", "memory_format": memory_format}
        outputs.write_json(
            paths.record,
            {
                "combination": asdict(combination),
                "hardware": hardware,
                "settings": {**settings, "warmup_steps": config.warmup_steps, "active_steps": config.active_steps},
                "timing": metrics,
                "step_times_ms": list(result.step_times_ms),
                "top_operators": [asdict(row) for row in top],
            },
        )
        outputs.write_json(paths.timing, metrics)
        tracker.log_metrics(metrics)
        tracker.log_series("step_time_ms", result.step_times_ms)
        tracker.log_text("profile/top_operators", markdown, "top_operators.md")
        for path in (paths.table_csv, paths.record, paths.trace):
            tracker.log_artifact(outputs.staged(path))
    print(markdown)


if __name__ == "__main__":
    run_stage("profile", main)
