"""DVC stage `train`: train the lab CNN on in-memory MNIST, log it, write checkpoint + metrics atomically."""

from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import (
    DATA_ROOT,
    MODEL_CHECKPOINT,
    TRAIN_EPOCHS_PLOT,
    TRAIN_METRICS,
    TRAIN_SPEED,
    TRAIN_STEPS_PLOT,
)
from pipeline.common.stage_runner import run_stage
from pipeline.common.tables import records_csv
from pipeline.data.artifacts import log_training_inputs
from pipeline.data.mnist import load_split, read_manifest
from pipeline.data.tensors import first_samples, to_device_data
from pipeline.model.checkpoint import checkpoint_digest, checkpoint_payload, save_checkpoint
from pipeline.params.loading import load_params
from pipeline.params.schema import section_as_dict
from pipeline.tracking.tags import MODEL_DIGEST_TAG
from pipeline.tracking.tracker import open_tracker
from pipeline.training.artifacts import (
    log_model,
    log_training_result,
    log_training_setup,
    quality_metrics,
    speed_metrics,
)
from pipeline.training.execution import choose_precision, measure_step_ms, resolve_execution
from pipeline.training.loop import EpochRecord, StepRecord, train_model
from pipeline.training.runtime import hardware_description, pin_runtime, select_device, select_precision


def main() -> None:
    params = load_params()
    config = params.train
    device = select_device(config.device)
    execution = resolve_execution(config.execution, device)
    runtime = pin_runtime(device, select_precision(config.precision, device), config.threads, config.seed)
    manifest = read_manifest(DATA_ROOT)
    data_digest = str(manifest["dataset_digest"])
    train = to_device_data(*first_samples(*load_split(DATA_ROOT, "train"), config.train_samples), device)
    test = to_device_data(*load_split(DATA_ROOT, "test"), device)
    train_params = section_as_dict(config)
    choice = choose_precision(config.precision, device, execution, measure_step_ms(config, train, device, execution))
    # Pinned again: a measurement above trains throw-away models, and training must start from the seed.
    runtime = pin_runtime(device, choice.precision, config.threads, config.seed)
    # The checkpoint records what ran; MLflow also records why (with measured times, which vary run to run).
    runtime_record = {**runtime.as_params(), "execution": execution}

    with open_tracker("train", params.tracking, system_metrics=True) as tracker, AtomicOutputs() as outputs:
        log_training_setup(
            tracker, train_params, {**runtime_record, **choice.as_params()}, hardware_description(device), data_digest
        )
        log_training_inputs(manifest, DATA_ROOT, {"train": len(train), "test": len(test)})
        result = train_model(config, train, test, device, runtime.precision, tracker, execution=execution)
        log_training_result(tracker, result, train_params, runtime_record)
        version = log_model(tracker, result.model, params.tracking.registered_model, result.optimizer_steps)

        metrics = quality_metrics(result)
        payload = checkpoint_payload(result.model, train_params, data_digest, runtime_record, metrics)
        checkpoint = outputs.staged(MODEL_CHECKPOINT)
        save_checkpoint(payload, checkpoint)
        tracker.set_tags({MODEL_DIGEST_TAG: checkpoint_digest(checkpoint)})  # the profile runs of it carry the same tag
        outputs.write_json(TRAIN_METRICS, metrics)
        outputs.write_json(TRAIN_SPEED, speed_metrics(result, runtime_record))
        outputs.write_text(TRAIN_STEPS_PLOT, records_csv(StepRecord, result.steps))
        outputs.write_text(TRAIN_EPOCHS_PLOT, records_csv(EpochRecord, result.epochs))
    print(
        f"test accuracy {metrics['test_accuracy']:.4f}, test loss {metrics['test_loss']:.4f} after "
        f"{len(result.epochs)} epoch(s); {result.images_per_second:.0f} images/s on {device} "
        f"({runtime.precision}, {execution}, {runtime.threads} thread(s)) -> {MODEL_CHECKPOINT}, "
        f"registered in MLflow as {version}\n"
        f"precision: {choice.reason}"
    )


if __name__ == "__main__":
    run_stage("train", main)
