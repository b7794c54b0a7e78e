"""Every MLflow record of a queued experiment stays true after `dvc queue kill`: stopped during profile@cpu's timing,
or during its report, the killed stage's runs (one per profile combination) and the experiment's `pipeline@...`
parent all end KILLED, none FINISHED, and no run of the store is left RUNNING. The train stage's kills, at ten
moments, are tests/test_signal_stress_queue.py's, which checks the same records.

One tiny project reproduced for the module and committed to git; each experiment is queued alone, and a worker is
started again when none is left (a `dvc queue kill` can end the worker too, treeverse/dvc#10562: docs/failures.md).
The profile experiment is killed inside its real timing: once its stage's timeline ($LAB_TIMELINE) says it is
`prepared` (every combination's run created, the timing servers ready), and the timeline must show it never reached
`timed`. The report experiment is held at `report-built` ($LAB_PAUSE_PLAN), after its run started.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.tracking.store import STORE_FILE
from pipeline.tracking.tags import EXPERIMENT_TAG, STAGE_TAG
from tests.helpers.projects import (
    kill_processes_in,
    processes_running,
    read_params,
    reproduced_copy,
    run_command,
    stage_environment,
)
from tests.helpers.stress import EXIT_LIMIT_S, PAUSE_LIMIT_S, keep_one_worker

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: a pipeline reproduced, two experiments

STATUS_LIMIT_S = 30.0  # until `dvc queue status` says Failed: each status call is a `dvc` start


@pytest.fixture(scope="module")
def project(mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The whole tiny pipeline reproduced and committed: an experiment reruns only the stages its params change."""
    project = reproduced_copy(tmp_path_factory.mktemp("queue-records") / "project", mnist_mirror)
    committed = run_command(
        ["bash", "-c", "git add -A && git -c user.name=t -c user.email=t@e commit -qm baseline"],
        project,
        stage_environment(mnist_mirror),
    )
    assert committed.returncode == 0, committed.stderr
    yield project
    kill_processes_in(project)


def experiment_runs(project: Path, name: str) -> dict[str, list[str]]:
    """The statuses of every run of DVC experiment `name` in the project's store, by stage (`pipeline`: its
    parent), each stage's newest first."""
    client = MlflowClient(f"sqlite:///{project / STORE_FILE}")
    experiment = client.get_experiment_by_name(read_params(project)["tracking"]["experiment"])
    assert experiment is not None
    found: dict[str, list[str]] = {}
    for run in client.search_runs([experiment.experiment_id], filter_string=f"tags.`{EXPERIMENT_TAG}` = '{name}'"):
        found.setdefault(run.data.tags.get(STAGE_TAG, ""), []).append(run.info.status)
    return found


def running_anywhere(project: Path) -> list[str]:
    client = MlflowClient(f"sqlite:///{project / STORE_FILE}")
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    return [run.info.run_name for run in client.search_runs(experiments, "attributes.status = 'RUNNING'")]


def worker_logs(project: Path) -> str:
    return "\n".join(path.read_text(errors="replace") for path in (project / ".dvc" / "tmp" / "exps").rglob("*.out"))


def queue_kill(project: Path, environment: dict[str, str], name: str, stage_module: bytes) -> None:
    """`dvc queue kill name`, then its stage gone within EXIT_LIMIT_S and the experiment Failed in the queue."""
    stages = processes_running(project, stage_module)
    assert stages, f"no running {stage_module.decode()} of {name}"
    signalled = time.monotonic()
    killed = run_command(["dvc", "queue", "kill", name], project, environment, limit_s=60)
    assert killed.returncode == 0, killed.stderr[-2000:]
    while alive := [pid for pid in stages if pid in processes_running(project, stage_module)]:
        assert time.monotonic() - signalled < EXIT_LIMIT_S, f"{name}'s stage {alive} still running"
        time.sleep(0.05)
    while True:
        status = run_command(["dvc", "queue", "status"], project, environment, limit_s=60).stdout
        if "Failed" in next((line for line in status.splitlines() if name in line), ""):
            return
        assert time.monotonic() - signalled < STATUS_LIMIT_S, f"{name} not Failed after the kill:\n{status}"
        time.sleep(0.3)


def test_a_queue_kill_during_profile_timing_and_report_leaves_every_record_of_the_experiment_killed(
    project: Path, mnist_mirror: Path
) -> None:
    timeline, plan = project.parent / "timeline", project.parent / "plan.json"
    plan.write_text(json.dumps({"kill-report": "report:report-built"}))
    environment = stage_environment(mnist_mirror, {"LAB_TIMELINE": str(timeline), "LAB_PAUSE_PLAN": str(plan)})
    combinations = len(read_params(project)["profile"]["batch_sizes"]) * len(read_params(project)["profile"]["modes"])
    starts: list[float] = []
    cases = (
        # name, what it changes (reruns that stage and the report), the stage killed, its runs, when to kill it
        ("kill-profile", "profile.top_k=5", "profile", combinations, "profile prepared"),
        ("kill-report", "report.languages=[en]", "report", 1, "[paused at report:report-built]"),
    )
    for name, change, stage, runs, moment in cases:
        timeline.write_text("")
        queued = run_command(["dvc", "exp", "run", "--queue", "-n", name, "-S", change], project, environment)
        assert queued.returncode == 0, queued.stderr[-2000:]
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while moment not in timeline.read_text() + worker_logs(project):
            keep_one_worker(project, environment, starts)
            assert time.monotonic() < deadline, f"{name} never reached {moment!r}:\n{worker_logs(project)[-3000:]}"
            time.sleep(0.2)
        queue_kill(project, environment, name, f"stages.{stage}".encode())
        if stage == "profile":
            assert "profile timed" not in timeline.read_text(), f"{name} was killed after its timing, not during it"
        records = experiment_runs(project, name)
        assert records == {stage: ["KILLED"] * runs, "pipeline": ["KILLED"]}, (name, records)
        assert running_anywhere(project) == [], name
