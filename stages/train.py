"""DVC stage `train`: train the lab CNN on in-memory MNIST, log it, write checkpoint + metrics atomically."""

from pipeline.atomic import AtomicOutputs
from pipeline.checkpoint import checkpoint_digest, checkpoint_payload, save_checkpoint
from pipeline.cli import run_stage
from pipeline.config import load_params, section_as_dict
from pipeline.data import load_split, read_manifest
from pipeline.paths import DATA_ROOT, MODEL_CHECKPOINT, TRAIN_EPOCHS_PLOT, TRAIN_METRICS, TRAIN_SPEED, TRAIN_STEPS_PLOT
from pipeline.runtime import hardware_description, pin_runtime, select_device, select_precision
from pipeline.tracking import open_tracker
from pipeline.train_artifacts import (
    log_model,
    log_training_result,
    log_training_setup,
    quality_metrics,
    speed_metrics,
)
from pipeline.tables import records_csv
from pipeline.training import EpochRecord, StepRecord, first_samples, to_device_data, train_model


def main() -> None:
    params = load_params()
    config = params.train
    device = select_device(config.device)
    runtime = pin_runtime(device, select_precision(config.precision, device), config.threads, config.seed)
    data_digest = str(read_manifest(DATA_ROOT)["dataset_digest"])
    train = to_device_data(*first_samples(*load_split(DATA_ROOT, "train"), config.train_samples), device)
    test = to_device_data(*load_split(DATA_ROOT, "test"), device)
    train_params = section_as_dict(config)

    with open_tracker("train", params.tracking) as tracker, AtomicOutputs() as outputs:
        log_training_setup(tracker, train_params, runtime.as_params(), hardware_description(device), data_digest)
        result = train_model(config, train, test, device, runtime.precision, tracker)
        log_training_result(tracker, result, train_params)
        log_model(tracker, result.model)

        metrics = quality_metrics(result)
        payload = checkpoint_payload(result.model, train_params, data_digest, runtime.as_params(), metrics)
        checkpoint = outputs.staged(MODEL_CHECKPOINT)
        save_checkpoint(payload, checkpoint)
        tracker.set_tags({"model.digest": checkpoint_digest(checkpoint)})  # the profile runs of it carry the same tag
        outputs.write_json(TRAIN_METRICS, metrics)
        outputs.write_json(TRAIN_SPEED, speed_metrics(result))
        outputs.write_text(TRAIN_STEPS_PLOT, records_csv(StepRecord, result.steps))
        outputs.write_text(TRAIN_EPOCHS_PLOT, records_csv(EpochRecord, result.epochs))
    print(
        f"test accuracy {metrics['test_accuracy']:.4f}, test loss {metrics['test_loss']:.4f} after "
        f"{len(result.epochs)} epoch(s); {result.images_per_second:.0f} images/s on {device} "
        f"({runtime.precision}, {runtime.threads} thread(s)) -> {MODEL_CHECKPOINT}"
    )


if __name__ == "__main__":
    run_stage("train", main)
