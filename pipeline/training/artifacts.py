"""What the train stage writes (metrics and plot files for DVC) and logs (MLflow, TensorBoard)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pipeline.common.allocator import current_allocator
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import MODEL_CHECKPOINT, TRAIN_EPOCHS_PLOT, TRAIN_METRICS, TRAIN_SPEED, TRAIN_STEPS_PLOT
from pipeline.common.tables import records_csv
from pipeline.devices.registry import device_kind, kind_of
from pipeline.model.checkpoint import checkpoint_digest, checkpoint_payload, save_checkpoint
from pipeline.model.network import LabNet
from pipeline.params.schema import RESOLVED_TRAIN_KEYS
from pipeline.tracking.tags import (
    DATA_DIGEST_TAG,
    EXPERIMENT_TAG,
    MODEL_DEVICE_TAG,
    MODEL_DIGEST_TAG,
    MODEL_ID_TAG,
    NAME_TAG,
    REGISTERED_MODEL_TAG,
    hardware_tags,
)
from pipeline.tracking.tracker import Tracker
from pipeline.training.loop import EpochRecord, StepRecord, TrainingResult
from pipeline.training.runtime import Ran

# Batch of the MLflow input example: > 1 so the exported model keeps a dynamic batch dimension.
EXAMPLE_BATCH = 2


def quality_metrics(result: TrainingResult) -> dict[str, float]:
    """Deterministic numbers for `metrics/train.json`: identical for identical params, data, machine."""
    last = result.epochs[-1]
    return {
        "test_accuracy": last.test_accuracy,
        "test_loss": last.test_loss,
        "train_accuracy": last.train_accuracy,
        "train_loss": last.train_loss,
        "epochs": len(result.epochs),
        "steps": result.optimizer_steps,
    }


def speed_metrics(result: TrainingResult, ran: Ran) -> dict[str, object]:
    """`metrics/train_speed.json`: wall-clock numbers (they differ run to run, so they are kept apart from
    `quality_metrics`) and what ran (device, precision, execution, threads after resolving `auto`, and the
    allocator set-up, pipeline.common.allocator), which the report quotes and `dvc metrics diff` compares across
    machines."""
    settings = ran.as_params()
    return {
        "train_seconds": round(result.train_seconds, 3),
        "images_per_second": round(result.images_per_second, 1),
        "cpu_share": round(result.cpu_share(ran.runtime.threads), 3),
        "machine_busy": busy_warning(result, ran) is not None,
        "runtime": {**{key: settings[key] for key in RESOLVED_TRAIN_KEYS}, "allocator": current_allocator().kind},
    }


# Below this share of its threads' CPUs, CPU training had to share the cores with other processes: alone it gets
# nearly all of them, beside one busy process about two thirds (docs/measurements.md gives the figures).
BUSY_CPU_SHARE = 0.8


def busy_warning(result: TrainingResult, ran: Ran) -> str | None:
    """The train stage's warning when CPU training had to share the cores (`speed_metrics`' `machine_busy`), as
    the profile stages warn about a busy machine."""
    threads = ran.runtime.threads
    share = result.cpu_share(threads)
    if not device_kind(ran.runtime.device.partition(":")[0]).on_host or share >= BUSY_CPU_SHARE:
        return None
    return (
        f"the machine was busy while training: its {threads} thread(s) got {share:.0%} of their CPUs, so "
        f"{result.images_per_second:.0f} images/s is slower than this machine trains alone (the model and its "
        "metrics are the same); rerun on a quiet machine for its speed"
    )


def resolved_params(train_params: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The `train` section as it ran: `auto` choices (and 0 threads) replaced by what ran, the request kept
    as `<key>_requested` where it differed, so Compare shows `precision bf16`, not `auto`."""
    resolved = dict(train_params)
    for key in RESOLVED_TRAIN_KEYS:
        if str(train_params[key]) != str(runtime[key]):
            resolved[key] = runtime[key]
            resolved[f"{key}_requested"] = train_params[key]
    return resolved


def log_training_setup(
    tracker: Tracker,
    train_params: Mapping[str, Any],
    runtime: Mapping[str, Any],
    hardware: Mapping[str, str],
    data_digest: str,
) -> None:
    """Params (`train.*` as it ran, `runtime.*` for how it was chosen and the allocator) and the machine as
    tags, which MLflow's Compare lists apart from params: they describe where a run ran, not a setting to compare."""
    tracker.log_params(resolved_params(train_params, runtime), prefix="train.")
    tracker.log_params(
        {
            **{key: value for key, value in runtime.items() if key not in (*RESOLVED_TRAIN_KEYS, "seed")},
            "allocator": current_allocator().description,
        },
        "runtime.",
    )
    tracker.set_tags({DATA_DIGEST_TAG: data_digest, **hardware_tags(hardware)})


def log_training_result(tracker: Tracker, result: TrainingResult, train_params: Mapping[str, Any], ran: Ran) -> None:
    """TensorBoard HParams for the run (the settings as they ran, with final quality and speed). MLflow needs
    no `final/*` copies: its run page and Compare show each curve's last value, which is the final one."""
    final = quality_metrics(result)
    resolved = resolved_params(train_params, ran.as_params())
    tracker.log_hparams(
        {f"train.{key}": value for key, value in resolved.items() if isinstance(value, (int, float, str, bool))},
        {
            "hparam/test_accuracy": final["test_accuracy"],
            "hparam/test_loss": final["test_loss"],
            "hparam/images_per_second": result.images_per_second,
        },
    )


def log_model(tracker: Tracker, result: TrainingResult, test_dataset: tuple[str, str]) -> str:
    """Log the trained model in MLflow's default torch.export format, with a dynamic batch dimension, as produced
    at its last optimizer step; returns its model URI (`models:/m-...`) for `register_model` once the stage's
    outputs are committed.

    MLflow links the run's metrics logged at that step (the final train values) to the logged model. The final
    test metrics are logged only now (train_model(log_final_test=False)), with the model and `test_dataset`
    ((name, digest) of the run's `mnist-test` input): so the model's page, and the registered version's, list
    them on mnist-test's row. MLflow's own copy cannot carry a dataset: its SQL store keeps none in a run's
    metric history, which is what `log_model(step=...)` copies from.

    An exported program keeps its weights on the device it was exported on, and MLflow's pyfunc loader
    (which also checks the input example while logging) refuses to move them: it loads on
    `serving_device()`. So the model is exported for that device, and loads and predicts on the machine
    that logged it, GPU or not; the checkpoint (weights saved from the CPU) is the portable copy.
    """
    import mlflow

    device = serving_device()
    model, step = result.model, result.optimizer_steps
    cpu_model = LabNet.from_description(model.checkpoint_description())
    cpu_model.load_state_dict({name: tensor.cpu() for name, tensor in model.state_dict().items()})
    cpu_model.eval()
    served: torch.nn.Module = cpu_model if kind_of(device).on_host else OnDevice(cpu_model, device).eval()
    example = np.zeros((EXAMPLE_BATCH, *cpu_model.input_shape), dtype=np.float32)
    info = mlflow.pytorch.log_model(
        served,
        name="model",
        step=step,
        input_example=example,
        # Pinned here: inferring requirements would import the model in a subprocess (slow).
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
    )
    final = result.epochs[-1]
    tracker.log_metrics(
        {"loss": final.test_loss, "accuracy": final.test_accuracy},
        step=step,
        prefix="test/",
        model_id=info.model_id,
        dataset=test_dataset,
    )
    tracker.set_tags({MODEL_DEVICE_TAG: str(device), MODEL_ID_TAG: info.model_id})
    return str(info.model_uri)


# The run's tags a registry version repeats, so that the Models page tells versions apart without opening runs.
VERSION_RUN_TAGS = (MODEL_DIGEST_TAG, DATA_DIGEST_TAG, EXPERIMENT_TAG, NAME_TAG)
REGISTERED_MODEL_DESCRIPTION = (
    "The AI-System Lab 1 CNN (LabNet: two 3x3 convolutions, max-pool, dropout, two fully connected layers) trained "
    "on MNIST by this pipeline's `train` stage. Each version is one train run whose checkpoint (models/model.pt) was "
    "written; its description and tags say how it was trained and how it scored on mnist-test."
)


def version_facts(
    metrics: Mapping[str, float], train_params: Mapping[str, Any], ran: Ran, test_images: int
) -> tuple[str, dict[str, str]]:
    """A registry version's description (markdown) and tags: its test quality, how it was trained, what ran."""
    runtime = ran.as_params()
    description = (
        f"Test accuracy **{metrics['test_accuracy']:.4f}**, loss {metrics['test_loss']:.4f} on mnist-test "
        f"({test_images:,} images) after {int(metrics['epochs'])} epoch(s) of Adadelta (lr {train_params['lr']}, "
        f"gamma {train_params['gamma']}, batch {train_params['batch_size']}, seed {train_params['seed']}), "
        f"{runtime['precision']} on {runtime['device']} ({runtime['execution']}, {runtime['threads']} thread(s)). "
        "The checkpoint is `models/model.pt` of the run's workspace (`dvc pull` or `dvc repro train` restores it)."
    )
    tags = {
        "test_accuracy": f"{metrics['test_accuracy']:.4f}",
        "test_loss": f"{metrics['test_loss']:.4f}",
        "test_images": str(test_images),
        "epochs": str(int(metrics["epochs"])),
        **{f"train.{key}": str(runtime[key]) for key in RESOLVED_TRAIN_KEYS},
    }
    return description, tags


def register_model(
    tracker: Tracker, model_uri: str, registered_model: str, description: str, tags: Mapping[str, str]
) -> str:
    """Register the logged model `model_uri` as a new version of `registered_model`, with `description` and `tags`
    (`version_facts`) plus the run's identity tags (VERSION_RUN_TAGS); returns `<name>/<version>`.

    The train stage calls it only after its outputs are committed: a version is what a student opens
    in the registry as "a trained model", so it must never exist for a run whose checkpoint was not written
    (a Ctrl-C, a failed rename). Registering late was chosen over deleting or tagging the version of a failed
    stage: the clean-up would run exactly when things are failing (a signal, a dying store) and could itself
    fail, leaving the lie in place. A failure here leaves the outputs written and the run FAILED, and says so.
    """
    import mlflow

    run_tags = tracker.client.get_run(tracker.run_id).data.tags
    version_tags = {**{key: run_tags[key] for key in VERSION_RUN_TAGS if key in run_tags}, **tags}
    try:
        registered = mlflow.register_model(model_uri, registered_model, tags=version_tags)
        tracker.client.update_model_version(registered_model, registered.version, description=description)
        if not tracker.client.get_registered_model(registered_model).description:
            tracker.client.update_registered_model(registered_model, description=REGISTERED_MODEL_DESCRIPTION)
    except mlflow.exceptions.MlflowException as error:
        raise PipelineError(
            f"the stage's outputs were written and its model logged ({model_uri}), but registering it as a version "
            f"of `{registered_model}` failed: {' '.join(str(error).split())[:300]}. Rerun `dvc repro -f train` "
            "once the store answers, or register it by hand: "
            f"`mlflow.register_model('{model_uri}', '{registered_model}')`."
        ) from None
    version = f"{registered_model}/{registered.version}"
    tracker.set_tags({REGISTERED_MODEL_TAG: version})
    return version


def serving_device() -> torch.device:
    """Where MLflow's pyfunc loader puts a PyTorch model on this machine (mlflow.pytorch._load_pyfunc):
    $MLFLOW_DEFAULT_PREDICTION_DEVICE if set, else the default CUDA device if there is one, else the CPU."""
    chosen = os.environ.get("MLFLOW_DEFAULT_PREDICTION_DEVICE")
    if chosen:
        return torch.device(chosen)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class OnDevice(torch.nn.Module):
    """`model` on `device`, taking input on any device and answering on the input's device.

    Exported with MLflow's CPU example, both copies become part of the program: it accepts CPU or
    `device` tensors (MLflow's pyfunc wrapper sends `device` tensors) and answers on the CPU.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model.to(device)
        self.device = device

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # aten._to_copy, not Tensor.to: torch.export guards each `.to` with an assert on its input's device
        # (the CPU of the example), which would refuse the GPU tensors the pyfunc wrapper passes.
        answer: torch.Tensor = self.model(torch.ops.aten._to_copy.default(images, device=self.device))
        on_input_device: torch.Tensor = torch.ops.aten._to_copy.default(answer, device=images.device)
        return on_input_device


def write_training_outputs(
    outputs: AtomicOutputs,
    tracker: Tracker,
    result: TrainingResult,
    train_params: dict[str, Any],
    data_digest: str,
    ran: Ran,
) -> dict[str, float]:
    """The checkpoint (its digest tagged on the run: the profile runs of it carry the same tag), metrics and
    plot files, staged in `outputs`; the quality metrics."""
    metrics = quality_metrics(result)
    checkpoint = outputs.staged(MODEL_CHECKPOINT)
    save_checkpoint(checkpoint_payload(result.model, train_params, data_digest, ran.as_params(), metrics), checkpoint)
    tracker.set_tags({MODEL_DIGEST_TAG: checkpoint_digest(checkpoint)})
    outputs.write_json(TRAIN_METRICS, metrics)
    outputs.write_json(TRAIN_SPEED, speed_metrics(result, ran))
    outputs.write_text(TRAIN_STEPS_PLOT, records_csv(StepRecord, result.steps))
    outputs.write_text(TRAIN_EPOCHS_PLOT, records_csv(EpochRecord, result.epochs))
    return metrics
