"""SIGTERM and SIGKILL mid-stage, on the real train stage of a project copy.

SIGTERM (what `timeout`, schedulers, CI and container stops send) must end like Ctrl-C: the MLflow run
KILLED, no output and no temp folder left, exit 143. SIGKILL runs no handler at all: the run it leaves
RUNNING is marked FAILED by the next stage started on this machine, once its process is proven gone.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipeline.common.processes import host_name, process_identity
from pipeline.tracking.tags import HOST_TAG, PROCESS_TAG, STALE_TAG
from tests.helpers.projects import (
    copy_project,
    read_params,
    run_command,
    stage_environment,
    started_training,
    write_params,
)

pytestmark = pytest.mark.slow

OUTPUTS = (
    "models/model.pt",
    "metrics/train.json",
    "metrics/train_speed.json",
    "plots/train_steps.csv",
    "plots/train_epochs.csv",
)


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """A project copy with MNIST in place and a training long enough (5 full epochs) to be interrupted."""
    project = copy_project(tmp_path_factory.mktemp("signals") / "project")
    result = run_command([sys.executable, "-m", "stages.download"], project, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    params = read_params(project)
    params["train"].update(epochs=5, train_samples=0, device="cpu")
    write_params(project, params)
    for relative in OUTPUTS:
        (project / relative).unlink(missing_ok=True)
    return project


def _client(project: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{project / 'mlflow.db'}")


def _train_runs(project: Path) -> list[Any]:
    client = _client(project)
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")


def test_sigterm_mid_training_ends_like_ctrl_c(downloaded: Path, mnist_mirror: Path) -> None:
    runs_before = len(_train_runs(downloaded)) if (downloaded / "mlflow.db").exists() else 0
    process = started_training(downloaded, mnist_mirror)
    process.send_signal(signal.SIGTERM)
    rest = process.communicate(timeout=120)[1]
    assert process.returncode == 143, rest[-2000:]
    assert "stage 'train' terminated (SIGTERM); no outputs were written." in rest
    assert "Traceback" not in rest
    assert not any((downloaded / relative).exists() for relative in OUTPUTS)
    assert list(downloaded.rglob(".partial-*")) == []
    runs = _train_runs(downloaded)
    assert len(runs) == runs_before + 1
    assert runs[0].info.status == "KILLED"


def test_sigkill_leaves_a_running_run_that_the_next_stage_marks_failed(downloaded: Path, mnist_mirror: Path) -> None:
    process = started_training(downloaded, mnist_mirror)
    process.kill()
    process.wait(timeout=60)
    (killed,) = [run for run in _train_runs(downloaded) if run.info.status == "RUNNING"]
    assert killed.data.tags[HOST_TAG] == host_name()

    # Two RUNNING runs that must be left alone: one of a live process (this one), one from another machine.
    client = _client(downloaded)
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    experiment_id = experiment.experiment_id
    live = client.create_run(
        experiment_id, tags={HOST_TAG: host_name(), PROCESS_TAG: process_identity(), "stage": "train"}
    )
    elsewhere = client.create_run(
        experiment_id, tags={HOST_TAG: "another-machine", PROCESS_TAG: "boot:1:1", "stage": "train"}
    )

    started = time.monotonic()
    result = run_command([sys.executable, "-m", "stages.download"], downloaded, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - started < 120
    marked = client.get_run(killed.info.run_id)
    assert marked.info.status == "FAILED"
    assert f"its process ({killed.data.tags[PROCESS_TAG]}) ended without closing the run" in marked.data.tags[STALE_TAG]
    assert client.get_run(live.info.run_id).info.status == "RUNNING"
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"
    for run in (live, elsewhere):
        client.set_terminated(run.info.run_id, "FINISHED")


def test_a_model_version_exists_only_for_a_run_whose_outputs_were_committed(
    downloaded: Path, mnist_mirror: Path
) -> None:
    """A Ctrl-C after the model was logged but before the outputs were committed leaves no
    registry version (it used to leave one with no checkpoint behind it); a run that commits registers one."""
    params = read_params(downloaded)
    quick = read_params(downloaded)
    quick["train"].update(epochs=1, train_samples=640, test_samples=500, threads=1)
    write_params(downloaded, quick)
    client = _client(downloaded)

    def versions() -> list[Any]:
        return client.search_model_versions("name = 'mnist-labnet'") if (downloaded / "mlflow.db").exists() else []

    try:
        before = len(versions())
        pause = {"LAB_PAUSE_AT": "train:outputs-staged"}
        process = started_training(downloaded, mnist_mirror, until="[paused at train:outputs-staged]", extra=pause)
        process.send_signal(signal.SIGINT)
        rest = process.communicate(timeout=120)[1]
        assert process.returncode == 130, rest[-2000:]
        assert "stage 'train' interrupted; no outputs were written." in rest
        (killed, *_) = _train_runs(downloaded)
        assert killed.info.status == "KILLED" and "model.id" in killed.data.tags  # the model was logged ...
        assert "model.registered_version" not in killed.data.tags
        assert len(versions()) == before  # ... and never became a registry version
        # The pipeline parent of that `dvc repro` shows the interruption, not FINISHED.
        parent_id = killed.data.tags["mlflow.parentRunId"]
        assert client.get_run(parent_id).info.status == "KILLED"
        assert not any((downloaded / relative).exists() for relative in OUTPUTS)

        result = run_command([sys.executable, "-m", "stages.train"], downloaded, stage_environment(mnist_mirror))
        assert result.returncode == 0, result.stderr[-3000:]
        (finished, *_) = _train_runs(downloaded)
        (newest, *_) = sorted(versions(), key=lambda version: int(version.version), reverse=True)
        assert len(versions()) == before + 1 and newest.run_id == finished.info.run_id
        assert finished.data.tags["model.registered_version"] == f"mnist-labnet/{newest.version}"
        assert f"registered in MLflow as mnist-labnet/{newest.version}" in result.stdout
        # The stage rerun and finished: its newest run stands for it, so the parent reads FINISHED again.
        assert finished.data.tags["mlflow.parentRunId"] == parent_id
        assert client.get_run(parent_id).info.status == "FINISHED"
    finally:
        write_params(downloaded, params)
        for relative in OUTPUTS:
            (downloaded / relative).unlink(missing_ok=True)
