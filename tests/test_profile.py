"""Profile stage: the operator table and timing in process, then the DVC matrix end to end."""

from __future__ import annotations

import csv
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.model import LabNet
from pipeline.profiling import Combination, OperatorRow, ProfileResult, make_step, profile_combination
from pipeline.tables import records_csv
from tests.conftest import LAB_MODEL, read_params, reproduced_copy, write_params

CONVOLUTION_OR_LINEAR = re.compile(r"conv|addmm|aten::mm|aten::linear")


def test_timing_metrics_are_computed_from_the_step_times() -> None:
    result = ProfileResult(Combination(16, "cpu", "train"), (10.0, 10.0, 12.0, 8.0), (), 5.0)
    metrics = result.timing_metrics()
    assert metrics["step_time_ms_mean"] == 10.0 and metrics["step_time_ms_p50"] == 10.0
    assert metrics["step_time_ms_p95"] == 12.0
    assert metrics["step_time_cv"] == pytest.approx((8 / 3) ** 0.5 / 10)  # sample stdev / mean
    assert metrics["per_sample_ms"] == 10.0 / 16 and metrics["throughput_samples_per_s"] == 1600.0


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_profile_of_a_real_model_ranks_operators_and_writes_a_trace(mode: str, tmp_path: Path) -> None:
    model = LabNet(LAB_MODEL)
    images, labels = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    weights_before = model.classifier.fc2.weight.detach().clone()
    trace = tmp_path / "trace.json.gz"
    result = profile_combination(Combination(16, "cpu", mode), make_step(model, mode, images, labels), torch.device("cpu"), 2, 4, trace)

    assert len(result.step_times_ms) == 4 and all(t > 0 for t in result.step_times_ms)
    names = [row.operator for row in result.operators]
    assert not any(name.startswith("ProfilerStep") for name in names)
    shares = [row.share_pct for row in result.operators]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(100.0)
    # Convolutions lead on a quiet machine; 4 steps on a busy one can let pooling edge ahead.
    assert any(CONVOLUTION_OR_LINEAR.search(name) for name in names[:3]), names[:5]
    assert result.peak_memory_mb > 4.5  # at least the 4.8 MB of weights were allocated
    with gzip.open(trace) as opened:
        assert any(event.get("name") == "aten::conv2d" for event in json.load(opened)["traceEvents"])
    if mode == "train":  # a real optimizer step ran
        assert not torch.equal(model.classifier.fc2.weight, weights_before)
        assert "aten::convolution_backward" in names
    rows = list(csv.DictReader(records_csv(OperatorRow, result.operators[:3]).splitlines()))
    assert [row["operator"] for row in rows] == names[:3]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """A copy after `dvc repro` of the whole matrix, with short timing windows."""
    return reproduced_copy(tmp_path_factory.mktemp("profiled") / "project", mnist_mirror, "profile")


COMBINATIONS = [f"{batch}-cpu-{mode}" for batch in (1, 16, 64) for mode in ("inference", "train")]


@pytest.mark.slow
def test_matrix_yields_six_tables_with_timing_and_traces(profiled: Path) -> None:
    assert sorted(p.name for p in (profiled / "profiles").iterdir()) == sorted(COMBINATIONS)
    for name in COMBINATIONS:
        folder = profiled / "profiles" / name
        rows = list(csv.DictReader((folder / "top_operators.csv").read_text().splitlines()))
        assert len(rows) == 10
        operators = [row["operator"] for row in rows]
        assert not any(op.startswith("ProfilerStep") for op in operators)
        if name == "1-cpu-train":  # at batch 1 the Adadelta update (16 small tensors) outweighs the convolutions
            assert any(CONVOLUTION_OR_LINEAR.search(op) for op in operators), (name, operators)
        else:
            assert any(CONVOLUTION_OR_LINEAR.search(op) for op in operators[:2]), (name, operators[:3])
        timing = json.loads((folder / "timing.json").read_text())
        assert timing["step_time_cv"] >= 0 and timing["per_sample_ms"] == pytest.approx(
            timing["step_time_ms_mean"] / int(name.split("-")[0])
        )
        record = json.loads((folder / "profile.json").read_text())
        assert record["combination"]["batch_size"] == int(name.split("-")[0])
        assert {"cpu", "cpu_count", "gpus", "os", "torch", "torch_cuda_build"} <= set(record["hardware"])
        assert record["settings"]["active_steps"] == 8 and len(record["step_times_ms"]) == 8
        with gzip.open(folder / "trace.json.gz") as trace:
            assert json.load(trace)["traceEvents"]
        assert f"| 1 | `{operators[0]}` |" in (folder / "top_operators.md").read_text()


@pytest.mark.slow
def test_one_mlflow_run_and_tensorboard_folder_per_combination(profiled: Path) -> None:
    client = MlflowClient(f"sqlite:///{profiled / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'profile'")
    assert sorted(run.info.run_name for run in runs) == sorted(f"profile@{name}" for name in COMBINATIONS)
    metric_names = {frozenset(run.data.metrics) for run in runs}
    assert len(metric_names) == 1  # identical names: MLflow's Compare lines them up
    assert {"step_time_ms_mean", "step_time_ms_p95", "step_time_cv", "throughput_samples_per_s"} <= set(next(iter(metric_names)))
    for run in runs:
        assert run.info.status == "FINISHED"
        assert {"batch_size", "device", "mode", "threads", "hardware.cpu", "hardware.torch"} <= set(run.data.params)
        assert run.info.run_name == f"profile@{run.data.params['batch_size']}-{run.data.params['device']}-{run.data.params['mode']}"
        assert len(client.get_metric_history(run.info.run_id, "step_time_ms")) == 8
        assert {"trace.json.gz", "top_operators.csv", "profile.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    folders = sorted((profiled / "runs" / "profile").iterdir())
    assert [folder.name.rsplit("-", 3)[0] for folder in folders] == sorted(COMBINATIONS)
    events = EventAccumulator(str(folders[0]))
    events.Reload()
    assert "step_time_ms_mean" in events.Tags()["scalars"]
    text = events.Tensors("profile/top_operators/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 1 | `" in text


@pytest.mark.slow
def test_adding_a_batch_size_runs_only_the_new_combinations(profiled: Path, run_in: Any) -> None:
    params = read_params(profiled)
    params["profile"]["batch_sizes"] = [1, 16, 32, 64]
    write_params(profiled, params)
    result = run_in(profiled, "dvc", "repro", "profile")
    assert result.returncode == 0, result.stderr[-3000:]
    ran = set(re.findall(r"Running stage '([^']+)'", result.stdout))
    assert ran == {"validate", "hardware", "profile@32-cpu-inference", "profile@32-cpu-train"}


@pytest.mark.slow
def test_other_hardware_invalidates_profiles_only(profiled: Path, run_in: Any) -> None:
    fingerprint = profiled / "hardware" / "fingerprint.json"
    original = fingerprint.read_text()
    moved = json.loads(original)
    moved["cpu"] = "Another CPU"  # what the hardware stage writes on another machine
    fingerprint.write_text(json.dumps(moved))
    status = json.loads(run_in(profiled, "dvc", "status", "--json").stdout)
    fingerprint.write_text(original)
    assert {"download", "train"}.isdisjoint(status)
    # export_graph never ran in this copy; whatever it waits for, it is not the hardware.
    assert "hardware/fingerprint.json" not in json.dumps(status.get("export_graph", []))
    for name in COMBINATIONS:
        assert {"changed deps": {"hardware/fingerprint.json": "modified"}} in status[f"profile@{name}"]


@pytest.mark.slow
def test_cuda_combination_without_cuda_fails_with_the_fix(profiled: Path, run_in: Any) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_in(profiled, "python", "-m", "stages.profile", "1", "cuda", "inference")
    assert result.returncode == 2
    assert "`profile.devices` is 'cuda' but no CUDA GPU is usable here" in result.stderr
    assert "Traceback" not in result.stderr
