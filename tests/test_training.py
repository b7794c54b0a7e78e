"""Model, training loop, checkpoints, atomic outputs and run status — in process, on real MNIST subsets."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from pipeline.common.errors import PipelineError
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.tables import records_csv
from pipeline.data.mnist import fetch_mnist, load_split, write_dataset
from pipeline.data.tensors import first_samples, to_device_data
from pipeline.model.checkpoint import checkpoint_payload, load_checkpoint, save_checkpoint
from pipeline.model.network import Dropout, LabNet
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import ModelConfig, TrackingConfig, TrainConfig, section_as_dict
from pipeline.tracking.lifecycle import open_tracker
from pipeline.training.artifacts import busy_warning, speed_metrics
from pipeline.training.loop import StepRecord, TrainingResult, evaluate, train_model
from pipeline.training.runtime import Ran, RuntimeSettings, pin_runtime, select_device, select_precision
from tests.helpers.repo import REPO_PARAMS
from tests.helpers.stores import empty_store

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mnist_root(mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    config = params_from_mapping(REPO_PARAMS).data
    write_dataset(fetch_mnist(config, [str(mnist_mirror)]), root)
    return root


@pytest.fixture
def tiny_train(tiny_params_mapping: dict[str, Any]) -> TrainConfig:
    """The tests' tiny training config (tests/helpers.py::tiny_params), on the CPU."""
    return dataclasses.replace(params_from_mapping(tiny_params_mapping).train, device="cpu")


def _train(config: TrainConfig, root: Path, test_images: int = 2000) -> Any:
    """`config` trained on the CPU, evaluated on the first `test_images` test images (fewer where a test asserts
    nothing about accuracy: the evaluation passes are most of a 640-image training's time)."""
    runtime = pin_runtime(CPU, select_precision(config.precision, CPU), config.threads, config.seed)
    train = to_device_data(*first_samples(*load_split(root, "train"), config.train_samples), CPU)
    test = to_device_data(*first_samples(*load_split(root, "test"), test_images), CPU)
    return train_model(config, train, test, CPU, runtime.precision, progress=False)


def test_flatten_size_is_derived_from_widths_and_input_shape() -> None:
    narrow = LabNet(
        ModelConfig(conv1_channels=4, conv2_channels=16, hidden_units=8, conv_dropout=0.1, hidden_dropout=0.1)
    )
    assert narrow.classifier.fc1.in_features == 16 * 12 * 12
    larger = LabNet(narrow.config, input_shape=(1, 32, 32))
    assert larger.classifier.fc1.in_features == 16 * 14 * 14
    log_probabilities = larger.eval()(torch.randn(3, 1, 32, 32))
    assert torch.allclose(log_probabilities.exp().sum(dim=1), torch.ones(3))


@pytest.mark.parametrize("p", [0.25, 0.5, 0.3])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
def test_dropout_drops_a_fraction_p_and_preserves_the_expectation(p: float, layout: str) -> None:
    torch.manual_seed(0)
    inputs = torch.ones(64, 64, 12, 12)
    if layout == "channels_last":
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        inputs = torch.ones(64, 64, 12, 24)[..., ::2]  # a view in neither layout
    outputs = Dropout(p).train()(inputs)
    assert outputs.shape == inputs.shape
    kept = outputs != 0
    assert torch.all(outputs[kept] == 1 / (1 - p))  # survivors scaled like nn.Dropout
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 590k draws: the std of the mean is < 0.0007
    assert abs(outputs.mean().item() - 1) < 0.01
    # No structure in the mask: drops are as frequent in every channel and in every position of the grid.
    per_channel = kept.float().mean(dim=(0, 2, 3))
    per_position = kept.float().mean(dim=(0, 1))
    assert per_channel.std().item() < 0.02 and per_position.std().item() < 0.02
    assert torch.equal(Dropout(p).eval()(inputs), inputs)


def test_dropout_masks_are_fresh_each_call_and_reproducible_from_the_seed() -> None:
    dropout, inputs = Dropout(0.5).train(), torch.ones(1000)
    torch.manual_seed(1)
    first, second = dropout(inputs), dropout(inputs)
    torch.manual_seed(1)
    assert not torch.equal(first, second) and torch.equal(dropout(inputs), first)


def test_absent_cuda_is_a_clear_user_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the error path needs a machine without it")
    with pytest.raises(
        PipelineError, match=r"`train.device` is 'cuda' but no CUDA GPU is usable here.*Set `train.device: cpu`"
    ):
        select_device("cuda")
    assert select_device("auto") == CPU


def test_too_many_train_samples_names_the_param() -> None:
    images, labels = np.zeros((10, 28, 28), np.uint8), np.arange(10, dtype=np.uint8)
    with pytest.raises(PipelineError, match=r"`train.train_samples` = 11 but the training set has 10 images"):
        first_samples(images, labels, 11)
    assert first_samples(images, labels, 0)[1].shape == (10,)
    with pytest.raises(PipelineError, match=r"`train.test_samples` = 11 but the test set has 10 images"):
        first_samples(images, labels, 11, "test")
    assert first_samples(images, labels, 3, "test")[1].tolist() == [0, 1, 2]


@pytest.mark.slow  # a real training (94 steps and a 2,000-image test pass): `make test` only
def test_training_learns_and_averages_over_the_right_counts(tiny_train: TrainConfig, mnist_root: Path) -> None:
    config = dataclasses.replace(tiny_train, train_samples=6000, log_every_steps=20)  # the last batch: 48 images
    result = _train(config, mnist_root)
    (epoch,) = result.epochs
    # 6,000 images, one epoch: ~0.93 on CPUs and GPUs seen so far; 0.85 leaves room for other kernels' rounding.
    assert epoch.test_accuracy > 0.85
    assert result.optimizer_steps == 94  # ceil(6000 / 64)
    assert [record.step for record in result.steps] == [20, 40, 60, 80, 94]
    # Each record averages its own window; the epoch mean is their sample-weighted mean.
    windows = [20 * 64] * 4 + [13 * 64 + 48]  # steps 81..94, the last of 48 images
    assert sum(windows) == 6000
    weighted = sum(record.train_loss * size for record, size in zip(result.steps, windows, strict=True)) / 6000
    assert epoch.train_loss == pytest.approx(weighted, rel=1e-9)
    assert 0 < epoch.train_accuracy < 1 and epoch.lr == tiny_train.lr


@pytest.mark.slow  # two trainings in process: seconds
def test_same_params_and_data_give_bit_identical_weights(tiny_train: TrainConfig, mnist_root: Path) -> None:
    config = dataclasses.replace(tiny_train, train_samples=320)
    first, second = _train(config, mnist_root, 500), _train(config, mnist_root, 500)
    assert first.epochs == second.epochs and first.steps == second.steps
    assert _weights_bytes(first.model) == _weights_bytes(second.model)
    other_seed = _train(dataclasses.replace(config, seed=2), mnist_root, 500)
    assert _weights_bytes(other_seed.model) != _weights_bytes(first.model)


def _weights_bytes(model: LabNet) -> bytes:
    buffer = io.BytesIO()
    torch.save({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, buffer)
    return buffer.getvalue()


@pytest.mark.slow  # a training and an MLflow run in process: seconds
def test_checkpoint_rebuilds_the_model_from_the_file_alone(
    tiny_train: TrainConfig, mnist_root: Path, tmp_path: Path
) -> None:
    result = _train(dataclasses.replace(tiny_train, train_samples=320), mnist_root, 500)
    path = tmp_path / "model.pt"
    save_checkpoint(
        checkpoint_payload(result.model, section_as_dict(tiny_train), "abc123", {"threads": 2}, {"test_accuracy": 0.5}),
        path,
    )
    raw = torch.load(path, weights_only=True)  # no arbitrary unpickling needed
    assert raw["train_params"]["model.hidden_units"] == 128 and raw["data_digest"] == "abc123"
    loaded = load_checkpoint(path)
    test = to_device_data(*first_samples(*load_split(mnist_root, "test"), 2000), CPU)
    # Same weights; the rebuilt model runs in the default memory format, so conv sums may differ in
    # the last bits from the channels_last original.
    (loss, accuracy), (original_loss, original_accuracy) = (
        evaluate(loaded.model, test, 1000),
        evaluate(result.model, test, 1000),
    )
    assert accuracy == original_accuracy and loss == pytest.approx(original_loss, rel=1e-6)

    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PipelineError, match="is not a readable checkpoint"):
        load_checkpoint(path)
    with pytest.raises(PipelineError, match="run the train stage first"):
        load_checkpoint(tmp_path / "absent.pt")


@pytest.mark.slow  # a training in process: seconds
def test_records_csv_has_header_and_one_row_per_record(tiny_train: TrainConfig, mnist_root: Path) -> None:
    result = _train(dataclasses.replace(tiny_train, train_samples=640, log_every_steps=5), mnist_root, 500)
    lines = records_csv(StepRecord, result.steps).splitlines()
    assert lines[0] == "step,epoch,train_loss,train_accuracy"
    assert len(lines) == 1 + len(result.steps) and lines[1].startswith("5,1,")


def test_atomic_outputs_write_all_or_nothing(tmp_path: Path) -> None:
    def interrupted_stage() -> None:
        with AtomicOutputs() as outputs:
            outputs.write_json(tmp_path / "metrics" / "a.json", {"x": 1})
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        interrupted_stage()
    assert [p for p in tmp_path.rglob("*") if p.is_file() or p.name.startswith(".partial-")] == []
    with AtomicOutputs() as outputs:
        outputs.write_json(tmp_path / "metrics" / "a.json", {"x": 1})
        outputs.write_text(tmp_path / "b.txt", "b")
    assert (tmp_path / "metrics" / "a.json").read_text() == '{\n  "x": 1\n}\n'
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.json", "b.txt"]


@pytest.mark.slow  # the train stage and its MLflow store in process: seconds
@pytest.mark.parametrize(
    ("error", "status"), [(RuntimeError, "FAILED"), (KeyboardInterrupt, "KILLED"), (None, "FINISHED")]
)
def test_stage_run_ends_with_the_status_of_what_happened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: type[BaseException] | None, status: str
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking = TrackingConfig(experiment="status-test", tensorboard_dir="runs", registered_model="lab-model")
    empty_store(tmp_path)
    try:
        with open_tracker("train", tracking, root=tmp_path) as tracker:
            tracker.log_metrics({"train/loss": 1.5}, step=3)
            if error is not None:
                raise error()
    except (RuntimeError, KeyboardInterrupt):
        pass
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name("status-test").experiment_id
    (run,) = client.search_runs([experiment_id], filter_string="tags.stage = 'train'")  # not its pipeline parent
    assert run.info.status == status
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")] == [(3, 1.5)]


def test_cpu_training_that_got_too_little_of_its_cpus_is_flagged_busy() -> None:
    """A loaded machine slowed training 3x with no word said: the share of its threads' CPUs that the training got
    tells (0.99 alone, 0.64 beside one busy process on 2 vCPUs: docs/measurements.md)."""
    model = LabNet(params_from_mapping(REPO_PARAMS).train.model)
    runtime = Ran(RuntimeSettings("cpu", "bf16", threads=2, seed=1, deterministic=True), "eager")
    busy = TrainingResult(model=model, train_seconds=10.0, cpu_seconds=13.0, train_samples=7_440)
    speed = speed_metrics(busy, runtime)
    assert speed["cpu_share"] == 0.65 and speed["machine_busy"] is True
    warning = busy_warning(busy, runtime)
    assert warning is not None and "got 65% of their CPUs, so 744 images/s is slower" in warning
    alone = dataclasses.replace(busy, cpu_seconds=19.9)
    assert speed_metrics(alone, runtime)["machine_busy"] is False and busy_warning(alone, runtime) is None
    on_gpu = Ran(RuntimeSettings("cuda", "bf16", 16, 1, True), "cuda_graph")  # the host waits on the GPU: no verdict
    assert busy_warning(busy, on_gpu) is None and speed_metrics(busy, on_gpu)["machine_busy"] is False
