"""End to end: `dvc repro` of download + train in a temp copy; stores, determinism, reruns, failures."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.data.mnist import MNIST_SHA256, dataset_digest, load_split
from pipeline.data.tensors import first_samples, to_device_data
from pipeline.model.checkpoint import load_checkpoint
from pipeline.training.loop import evaluate
from tests.helpers.projects import clone_project, ignored_sigint, read_params, started_training, write_params

pytestmark = pytest.mark.slow

OUTPUTS = ("models/model.pt", "metrics/train.json", "plots/train_steps.csv", "plots/train_epochs.csv")


def _digests(project: Path) -> dict[str, str]:
    return {name: hashlib.sha256((project / name).read_bytes()).hexdigest() for name in OUTPUTS}


def _train_runs(project: Path) -> list[Any]:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    return client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    """One project copy after `dvc repro` (training included), shared by the tests below (in order)."""
    return clone_project(reproduced_project, tmp_path_factory.mktemp("trained") / "project")


def test_train_stage_outputs_describe_a_learned_model(trained: Path) -> None:
    metrics = json.loads((trained / "metrics/train.json").read_text())
    assert metrics["test_accuracy"] > 0.80 and metrics["steps"] == 50  # learned: chance is 0.10
    checkpoint = load_checkpoint(trained / "models/model.pt")
    assert checkpoint.data_digest == dataset_digest(MNIST_SHA256)
    assert checkpoint.train_params["train_samples"] == 3200 and checkpoint.train_params["test_samples"] == 2000
    # The stated accuracy is that of the first 2,000 test images (train.test_samples), exactly.
    test = to_device_data(*first_samples(*load_split(trained / "data", "test"), 2000, "test"), torch.device("cpu"))
    loss, accuracy = evaluate(checkpoint.model, test, 1000)
    assert accuracy == metrics["test_accuracy"] and loss == pytest.approx(metrics["test_loss"], rel=1e-6)
    epochs = (trained / "plots/train_epochs.csv").read_text().splitlines()
    assert epochs[0] == "epoch,lr,train_loss,train_accuracy,test_loss,test_accuracy" and len(epochs) == 2
    assert len((trained / "plots/train_steps.csv").read_text().splitlines()) == 1 + 5


def test_train_run_in_mlflow_has_params_curves_model_and_data_digest(trained: Path) -> None:
    (run,) = _train_runs(trained)
    assert run.info.status == "FINISHED"
    params, tags = run.data.params, run.data.tags
    assert params["train.lr"] == "1.0" and params["train.model.hidden_units"] == "128"
    # What ran, not what was asked: `auto` resolved, the request kept beside it.
    ran = json.loads((trained / "metrics/train_speed.json").read_text())["runtime"]
    assert params["train.device"] == ran["device"] == "cpu" and params["train.device_requested"] == "auto"
    assert params["train.precision"] == ran["precision"] != "auto" and ran["execution"] == "eager"
    assert params["train.precision_requested"] == "auto" and int(params["train.threads"]) >= 1
    assert "runtime.precision_reason" in params and "runtime.threads" not in params
    # The stage tuned glibc's allocator (pipeline.common.allocator) and says so where speed is read.
    assert ran["allocator"] == "tuned" and params["runtime.allocator"].startswith("glibc ")
    assert "tuned: no mmap" in params["runtime.allocator"]
    # The machine is described by tags (as on every stage), not by params Compare would list.
    assert tags["hardware.device_name"] and not [key for key in params if key.startswith("hardware.")]
    assert tags["data.digest"] == dataset_digest(MNIST_SHA256)
    client = MlflowClient(f"sqlite:///{trained / 'mlflow.db'}")
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [10, 20, 30, 40, 50]
    assert history[-1].value < history[0].value  # it learns
    # One x axis: test and per-epoch values at the optimizer step their epoch ended on, not at epoch 1.
    for key in ("test/accuracy", "test/loss", "train/lr", "train/epoch_loss", "train/images_per_second"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [50], key
    assert [m.value for m in client.get_metric_history(run.info.run_id, "train/epoch")] == [0.2, 0.4, 0.6, 0.8, 1.0]
    # Grouped: every metric has a section prefix; no single-point `final/*` copies of the curves' last values.
    assert {key.split("/")[0] for key in run.data.metrics} == {"train", "test", "system"}
    assert (
        run.data.metrics["test/accuracy"] == json.loads((trained / "metrics/train.json").read_text())["test_accuracy"]
    )
    # MLflow's own system metrics (psutil), sampled while training.
    assert run.data.metrics["system/cpu_utilization_percentage"] >= 0
    assert run.data.metrics["system/system_memory_usage_megabytes"] > 0

    # The data the run read, as MLflow datasets shared with the download run (same name and digest).
    inputs = {item.dataset.name: item for item in run.inputs.dataset_inputs}
    assert set(inputs) == {"mnist-train", "mnist-test"}
    input_tags = {name: {tag.key: tag.value for tag in item.tags} for name, item in inputs.items()}
    # The test split as evaluated: its first 2,000 images (train.test_samples).
    assert input_tags["mnist-train"]["samples"] == "3200" and input_tags["mnist-test"]["samples"] == "2000"
    assert input_tags["mnist-train"]["mlflow.data.context"] == "training"
    (download,) = client.search_runs([run.info.experiment_id], filter_string="tags.stage = 'download'")
    assert {i.dataset.digest for i in download.inputs.dataset_inputs} == {i.dataset.digest for i in inputs.values()}

    mlflow.set_tracking_uri(f"sqlite:///{trained / 'mlflow.db'}")
    (logged,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert logged.source_run_id == run.info.run_id and logged.model_id == tags["model.id"]
    # The final metrics (those at the step the model was logged at) are linked to it: the model's page shows them.
    linked = {metric.key: metric for metric in logged.metrics}
    assert {"test/accuracy", "test/loss", "train/epoch_loss", "train/loss"} <= set(linked)
    assert linked["test/accuracy"].value == run.data.metrics["test/accuracy"] and linked["test/accuracy"].step == 50
    # ... the test metrics on the row of the dataset they were measured on, as the run logged it: one
    # value each, not also a copy without the dataset.
    assert [metric.key for metric in logged.metrics].count("test/accuracy") == 1
    test_dataset = ("mnist-test", inputs["mnist-test"].dataset.digest)
    for key in ("test/accuracy", "test/loss"):
        assert (linked[key].dataset_name, linked[key].dataset_digest) == test_dataset
    # The run's own curve has the final point once (logged with the model, not before it as well).
    history = client.get_metric_history(run.info.run_id, "test/accuracy")
    assert [point.step for point in history] == [50] and history[0].value == linked["test/accuracy"].value
    # A registered model version per training run, named by `tracking.registered_model`.
    (version,) = client.search_model_versions("name = 'mnist-labnet'")
    assert version.run_id == run.info.run_id and version.source == f"models:/{logged.model_id}"
    assert tags["model.registered_version"] == f"mnist-labnet/{version.version}"
    model = mlflow.pytorch.load_model(f"models:/{logged.model_id}")
    reference = load_checkpoint(trained / "models/model.pt").model
    # Exported for the device MLflow serves on here: on a GPU its convolutions run in TF32.
    served_on = run.data.tags["model.serving_device"]
    assert served_on == ("cuda" if torch.cuda.is_available() else "cpu")
    for batch in (1, 16, 64):
        images = torch.randn(batch, 1, 28, 28)
        assert torch.allclose(model(images), reference(images), atol=1e-5 if served_on == "cpu" else 2e-3)


def test_tensorboard_run_folder_holds_curves_and_hparams(trained: Path) -> None:
    (run,) = _train_runs(trained)
    (logdir,) = (trained / "runs" / "train").iterdir()
    assert logdir.name.endswith(run.info.run_id[:8])
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [10, 20, 30, 40, 50]
    assert [event.step for event in events.Scalars("test/accuracy")] == [50]
    # Sections: every scalar tag is grouped under a prefix TensorBoard draws as one section.
    assert {tag.split("/")[0] for tag in events.Tags()["scalars"]} == {"train", "test", "hparam"}
    assert set(events.PluginTagToContent("hparams")) == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    assert [d for d in logdir.iterdir() if d.is_dir()] == []  # one folder per run: no hparams sub-run


def test_rerun_is_bit_identical_and_lr_edit_reruns_only_train(trained: Path, run_in: Any) -> None:
    before = _digests(trained)
    forced = run_in(trained, "dvc", "repro", "--force", "--single-item", "train")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert _digests(trained) == before

    params = read_params(trained)
    params["train"]["lr"] = 0.5
    write_params(trained, params)
    status = run_in(trained, "dvc", "status", "--json", "download", "train")
    assert set(json.loads(status.stdout)) == {"train"}
    rerun = run_in(trained, "dvc", "repro", "train")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Stage 'download' didn't change, skipping" in rerun.stdout and "Running stage 'train'" in rerun.stdout
    assert _digests(trained)["models/model.pt"] != before["models/model.pt"]
    assert len(_train_runs(trained)) == 3


def test_cuda_on_a_machine_without_it_fails_before_work(trained: Path, run_in: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    params = read_params(trained)
    params["train"]["device"] = "cuda"
    write_params(trained, params)
    result = run_in(trained, sys.executable, "-m", "stages.train")
    assert result.returncode == 2
    assert "`train.device` is 'cuda' but no CUDA GPU is usable here" in result.stderr
    assert "Traceback" not in result.stderr
    params["train"].update(device="cpu", execution="cuda_graph")  # graphs need CUDA whatever the device
    write_params(trained, params)
    result = run_in(trained, sys.executable, "-m", "stages.train")
    assert result.returncode == 2
    assert "`train.execution` is 'cuda_graph' but training runs on 'cpu'" in result.stderr
    assert "Traceback" not in result.stderr
    params["train"]["execution"] = "auto"
    write_params(trained, params)


def test_ctrl_c_mid_training_writes_nothing_and_marks_the_run_killed(
    trained: Path, run_in: Any, mnist_mirror: Path
) -> None:
    params = read_params(trained)
    params["train"].update(epochs=5, train_samples=0)
    write_params(trained, params)
    for relative in OUTPUTS:
        (trained / relative).unlink(missing_ok=True)
    process = started_training(trained, mnist_mirror)
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode == 130
    assert "interrupted; no outputs were written" in rest and "Traceback" not in rest
    assert not any((trained / relative).exists() for relative in OUTPUTS)
    assert not [p for p in trained.rglob(".partial-*")]
    assert [run.info.status for run in _train_runs(trained)].count("KILLED") == 1


def _ignored_signals(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


def test_a_stage_started_with_sigint_ignored_keeps_ignoring_it_and_stops_on_sigterm(
    trained: Path, mnist_mirror: Path
) -> None:
    """Started as a background job (`cmd &` in a script: SIGINT ignored), a stage respects that, as POSIX tools
    do: a Ctrl-C meant for the foreground does not stop it. SIGTERM (`kill`, `timeout`, schedulers) does."""
    params = read_params(trained)
    params["train"].update(epochs=5, train_samples=0)
    write_params(trained, params)
    for relative in OUTPUTS:
        (trained / relative).unlink(missing_ok=True)
    killed_before = [run.info.status for run in _train_runs(trained)].count("KILLED")
    process = started_training(trained, mnist_mirror, preexec=ignored_sigint)
    try:
        assert _ignored_signals(process.pid) & (1 << (signal.SIGINT - 1))
        process.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=3)  # still training
    finally:
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[1]
    assert process.returncode == 143
    assert "terminated (SIGTERM); no outputs were written" in rest and "Traceback" not in rest
    assert not any((trained / relative).exists() for relative in OUTPUTS)
    assert [run.info.status for run in _train_runs(trained)].count("KILLED") == killed_before + 1
