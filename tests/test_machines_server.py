"""The machines report against a real `mlflow server` on 127.0.0.1, fed by two machines: this one (the
real pipeline, `dvc repro` with $MLFLOW_TRACKING_URI pointing at the server) and the H100 reference
results logged as a second machine that profiled the same checkpoint."""

from __future__ import annotations

import csv
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipeline.common.machine import machine_fingerprint
from pipeline.records.quantities import Interval
from pipeline.tracking.tags import ID_TAG, NAME_TAG, identity_tags
from tests.helpers.projects import (
    copy_without_outputs,
    read_params,
    run_command,
    stage_environment,
    tiny_params,
    write_params,
)
from tests.helpers.records import copy_profiles, gpu_run, log_profile_folder
from tests.helpers.servers import running_mlflow_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


@pytest.fixture(scope="module")
def two_machines(server: str, tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> dict[str, Any]:
    """This machine profiles batch 1 and 64 inference on the CPU through the real stages (same warm-up and
    timed steps as the H100 reference); then the H100's results are logged for the same checkpoint."""
    project = copy_without_outputs(tmp_path_factory.mktemp("here") / "project")
    params = tiny_params(read_params(project))
    params["profile"].update(batch_sizes=[1, 64], modes=["inference"], warmup_steps=10, active_steps=30)
    params["train"].update(train_samples=640, test_samples=500)  # any checkpoint will do: its digest is compared
    write_params(project, params)
    environment = stage_environment(mnist_mirror, {"MLFLOW_TRACKING_URI": server})
    environment.pop("LAB_MACHINE_LABEL", None)
    result = run_command(["dvc", "repro", "profile"], project, environment)
    assert result.returncode == 0, result.stderr[-3000:]

    client = MlflowClient(server)
    experiment_id = client.get_experiment_by_name("mnist-lab").experiment_id
    here = client.search_runs([experiment_id], filter_string="tags.stage = 'profile'")
    model_digest = here[0].data.tags["model.digest"]
    h100 = log_profile_folder(
        client,
        experiment_id,
        copy_profiles(gpu_run() / "profiles", tmp_path_factory.mktemp("h100")),
        model_digest,
    )
    return {
        "project": project,
        "environment": environment,
        "client": client,
        "experiment_id": experiment_id,
        "here": {run.info.run_id for run in here},
        "h100": set(h100.values()),
        "model_digest": model_digest,
    }


def test_every_stage_run_carries_this_machine_and_the_checkpoint_digest(two_machines: dict[str, Any]) -> None:
    client: MlflowClient = two_machines["client"]
    expected = identity_tags(machine_fingerprint())
    stage_runs = client.search_runs([two_machines["experiment_id"]])
    # one run per stage (the two profile runs have the same tags) and the `dvc repro`'s parent run
    by_stage = {run.data.tags["stage"]: run for run in stage_runs if run.info.run_id not in two_machines["h100"]}
    assert set(by_stage) == {"pipeline", "download", "train", "roofs", "profile"}
    for run in by_stage.values():
        assert {run.data.tags[NAME_TAG], run.data.tags[ID_TAG]} == {expected[NAME_TAG], expected[ID_TAG]}
    checkpoint = hashlib.sha256((two_machines["project"] / "models" / "model.pt").read_bytes()).hexdigest()
    assert by_stage["train"].data.tags["model.digest"] == checkpoint == two_machines["model_digest"]


def test_machines_report_from_the_server_puts_this_machine_beside_the_h100(two_machines: dict[str, Any]) -> None:
    project: Path = two_machines["project"]
    client: MlflowClient = two_machines["client"]
    result = run_command(
        [sys.executable, "-m", "pipeline.machines", "--output", "machines"], project, two_machines["environment"]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((project / "machines" / "machines.csv").read_text().splitlines()))
    assert {row["group"] for row in rows} == {"1"}  # one checkpoint, one set of settings
    assert {row["run_id"] for row in rows} == two_machines["here"] | two_machines["h100"]
    here_name = identity_tags(machine_fingerprint())[NAME_TAG]
    assert sorted({row["machine"] for row in rows}) == sorted(
        {here_name, "NVIDIA H100 80GB HBM3 + Intel Xeon (16 vCPUs, AMX)"}
    )
    # The stage names its metrics `profile/...`: compared here by the statistic's own name.
    metrics = {
        row["run_id"]: {
            key.removeprefix("profile/"): v for key, v in client.get_run(row["run_id"]).data.metrics.items()
        }
        for row in rows
    }
    for row in rows:
        logged = metrics[row["run_id"]]
        assert row["statistic"] == "median"
        for column, name in (
            ("step_time_ms", "step_time_ms_median"),
            ("step_time_ms_ci_low", "step_time_ms_ci_low"),
            ("step_time_ms_ci_high", "step_time_ms_ci_high"),
            ("per_sample_ms", "per_sample_ms"),
            ("throughput_samples_per_s", "throughput_samples_per_s"),
        ):
            assert float(row[column]) == pytest.approx(logged[name], rel=1e-5), column  # CSV: 6 digits
    markdown = (project / "machines" / "machines.md").read_text()
    assert f"from `{two_machines['environment']['MLFLOW_TRACKING_URI']}` (experiment `mnist-lab`)" in markdown
    ratios = markdown.split("### Group 1: ratios")[1]
    assert f"speed-up over **{here_name} · cpu**" in ratios  # this machine is the default baseline

    def per_sample(row: dict[str, str]) -> Interval:
        logged, batch = metrics[row["run_id"]], int(row["batch_size"])
        median, low, high = (logged[f"step_time_ms_{name}"] for name in ("median", "ci_low", "ci_high"))
        return Interval(median / batch, low / batch, high / batch)

    here = {int(row["batch_size"]): per_sample(row) for row in rows if row["machine"] == here_name}
    h100 = {
        (int(row["batch_size"]), row["device"]): per_sample(row)
        for row in rows
        if row["machine"] != here_name and row["mode"] == "inference"
    }
    ratio_lines = [line for line in ratios.splitlines() if line.startswith("| inference |")]
    assert [line.split(" | ")[1] for line in ratio_lines] == ["1", "64"]  # only the combinations this machine ran
    for line in ratio_lines:
        batch = int(line.split(" | ")[1])
        cells = line.strip(" |").split(" | ")[2:]  # one per platform, sorted: the H100's cpu, then its cuda
        assert cells == [(here[batch] / h100[(batch, device)]).with_interval() for device in ("cpu", "cuda")]
    assert "| train |" not in ratios
