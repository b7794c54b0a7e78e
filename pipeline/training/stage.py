"""The train stage's work, in the order it commits to it: data on the device, the MLflow run, training, the model and
the outputs staged, then (outputs committed) the registry version.

The named moments (`pause_at`, pipeline.common.interrupts) are where the signal tests hold the stage to deliver a
signal through the real paths; unset, each costs one string comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.common.interrupts import pause_at
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import DATA_ROOT, MODEL_CHECKPOINT
from pipeline.data.artifacts import log_training_inputs
from pipeline.data.mnist import load_split, read_manifest
from pipeline.data.tensors import first_samples, to_device_data
from pipeline.params.schema import Params, section_as_dict
from pipeline.tracking.lifecycle import open_tracker
from pipeline.training.artifacts import (
    busy_warning,
    log_model,
    log_training_result,
    log_training_setup,
    register_model,
    version_facts,
    write_training_outputs,
)
from pipeline.training.execution import resolve_execution, settle_runtime
from pipeline.training.loop import train_model
from pipeline.training.runtime import Ran, hardware_description, select_device


@dataclass(frozen=True)
class Trained:
    """What the stage tells the user when it is done."""

    summary: str
    warning: str | None  # the machine was busy while training


def train_and_register(params: Params) -> Trained:
    config = params.train
    device = select_device(config.device)
    execution = resolve_execution(config.execution, device)
    manifest = read_manifest(DATA_ROOT)
    data_digest = str(manifest["dataset_digest"])
    train = to_device_data(*first_samples(*load_split(DATA_ROOT, "train"), config.train_samples), device)
    test = to_device_data(*first_samples(*load_split(DATA_ROOT, "test"), config.test_samples, "test"), device)
    train_params = section_as_dict(config)
    runtime, choice = settle_runtime(config, device, execution, train)
    # The checkpoint records what ran; MLflow also records why (with measured times, which vary run to run).
    ran = Ran(runtime, execution)
    pause_at("loaded")

    with open_tracker("train", params.tracking, system_metrics=True) as tracker:
        with AtomicOutputs() as outputs:
            pause_at("run-started")
            log_training_setup(
                tracker,
                train_params,
                {**ran.as_params(), **choice.as_params()},
                hardware_description(device),
                data_digest,
            )
            datasets = log_training_inputs(manifest, DATA_ROOT, {"train": len(train), "test": len(test)})
            pause_at("setup-logged")
            result = train_model(
                config, train, test, device, runtime.precision, tracker, execution=execution, log_final_test=False
            )
            pause_at("trained")
            log_training_result(tracker, result, train_params, ran)
            model_uri = log_model(tracker, result, datasets["test"])
            pause_at("model-logged")
            metrics = write_training_outputs(outputs, tracker, result, train_params, data_digest, ran)
            pause_at("outputs-staged")
        # Committed: only now is the model a registry version, so none exists without its checkpoint.
        description, version_tags = version_facts(metrics, train_params, ran, len(test))
        version = register_model(tracker, model_uri, params.tracking.registered_model, description, version_tags)
    summary = (
        f"test accuracy {metrics['test_accuracy']:.4f}, test loss {metrics['test_loss']:.4f} after "
        f"{len(result.epochs)} epoch(s); {result.images_per_second:.0f} images/s on {device} "
        f"({runtime.precision}, {execution}, {runtime.threads} thread(s)) -> {MODEL_CHECKPOINT}, "
        f"registered in MLflow as {version}\n"
        f"precision: {choice.reason}"
    )
    return Trained(summary, busy_warning(result, ran))
