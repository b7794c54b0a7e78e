"""Parallel experiments: `dvc exp run --queue` + `dvc queue start -j 2` all log into the project's store."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.helpers.projects import clone_project, kill_processes_in
from tests.helpers.repo import REPO_ROOT

pytestmark = pytest.mark.slow
LEARNING_RATES = ("0.8", "1.2")  # as many as run at once: -j 2
QUEUE_LIMIT_S = 600


def test_queued_experiments_run_two_at_a_time_into_one_mlflow_store(
    tmp_path: Path, reproduced_project: Path, run_in: Any
) -> None:
    project = clone_project(reproduced_project, tmp_path / "project")
    committed = run_in(project, "bash", "-c", "git add -A && git -c user.name=t -c user.email=t@e commit -qm baseline")
    assert committed.returncode == 0, committed.stderr
    for rate in LEARNING_RATES:
        queued = run_in(project, "dvc", "exp", "run", "--queue", "train", "-S", f"train.lr={rate}")
        assert queued.returncode == 0, queued.stderr[-2000:]
    try:
        status = _run_queue(project, run_in)
    finally:
        kill_processes_in(project)
    for line in status.splitlines():
        if "Success" in line:
            logs = run_in(project, "dvc", "queue", "logs", line.split()[1]).stdout
            assert "database is locked" not in logs and "Traceback" not in logs

    # Every run landed in the project's own store (the copies under .dvc/tmp/exps have none).
    assert not list((project / ".dvc" / "tmp").rglob("mlflow.db"))
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")
    assert all(run.info.status == "FINISHED" for run in runs)
    queued_runs = [run for run in runs if "dvc.experiment" in run.data.tags]
    assert sorted(run.data.params["train.lr"] for run in queued_runs) == sorted(LEARNING_RATES)
    assert len({run.data.tags["dvc.experiment"] for run in queued_runs}) == len(LEARNING_RATES)
    assert all(len(client.get_metric_history(run.info.run_id, "train/loss")) == 5 for run in queued_runs)
    # Each experiment's pipeline parent carries its DVC experiment like its children, and ended FINISHED with them.
    for run in queued_runs:
        parent = client.get_run(run.data.tags["mlflow.parentRunId"])
        assert parent.data.tags["stage"] == "pipeline", parent.data.tags
        assert parent.data.tags["dvc.experiment"] == run.data.tags["dvc.experiment"]
        assert parent.data.tags["dvc.baseline_rev"] == run.data.tags["dvc.baseline_rev"]
        assert parent.info.status == "FINISHED"
    assert len(list((project / "runs" / "train").iterdir())) == len(runs)  # TensorBoard folders too

    shown = json.loads(run_in(project, "dvc", "exp", "show", "--json").stdout)
    accuracies = [
        experiment_run["data"]["metrics"]["metrics/train.json"]["data"]["test_accuracy"]
        for commit in shown
        for experiment_group in commit.get("experiments") or []
        for experiment_run in experiment_group["revs"]
    ]
    assert len(accuracies) == len(LEARNING_RATES) and all(accuracy > 0.8 for accuracy in accuracies)

    # The README's `dvc exp show` recipes print whole tables in a 160-column terminal: no column
    # squeezed to DVC's "…", and the experiment's own param and the headline metric are among the columns.
    recipes = [
        shlex.split(line.split("#")[0])
        for line in (REPO_ROOT / "README.md").read_text().splitlines()
        if line.startswith("dvc exp show ")
    ]
    assert len(recipes) == 2, recipes
    for recipe in recipes:
        table = run_in(project, *recipe, env={"COLUMNS": "160"})
        assert table.returncode == 0, table.stderr[-2000:]
        lines = table.stdout.splitlines()
        assert max(map(len, lines)) <= 160 and "…" not in table.stdout, table.stdout
        header = next(line for line in lines if "Experiment" in line)
        assert "train.lr" in header and "test_accuracy" in header, table.stdout
        assert all(f" {rate} " in table.stdout for rate in LEARNING_RATES), table.stdout


def _run_queue(project: Path, run_in: Any) -> str:
    """`dvc queue start -j 2`, then `dvc queue status` until nothing is queued or running."""
    started = run_in(project, "dvc", "queue", "start", "-j", "2", limit_s=60)
    assert started.returncode == 0, started.stderr[-2000:]
    deadline = time.monotonic() + QUEUE_LIMIT_S
    while True:
        status = run_in(project, "dvc", "queue", "status", limit_s=60).stdout
        if "Queued" not in status and "Running" not in status:
            break
        if time.monotonic() > deadline:
            worker_logs = "\n".join(
                path.read_text()[-1500:] for path in (project / ".dvc" / "tmp" / "exps").rglob("*.out")
            )
            pytest.fail(f"queue not done after {QUEUE_LIMIT_S} s:\n{status}\nworker logs:\n{worker_logs}")
        time.sleep(3)
    assert status.count("Success") == len(LEARNING_RATES), status
    return status
