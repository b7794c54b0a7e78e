"""Ctrl-C and SIGTERM's third path (tests/test_signal_stress.py has the other two): `dvc queue kill` of a queued
experiment paused at each of the ten moments of its train stage. Every time: its stage gone within 10 s, the
experiment Failed in `dvc queue status`, every MLflow record of it true (where its run had been started, that run and
the experiment's `pipeline@...` parent KILLED, else no run at all; no run of the store left RUNNING), no result left
for it, and the workspace's outputs as they were. The same records after a kill during profile@cpu's timing or the
report: tests/test_queue_kill_records.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.tracking.tags import EXPERIMENT_TAG, STAGE_TAG
from tests.helpers.projects import kill_processes_in, processes_running, run_command, stage_environment
from tests.helpers.stress import (
    EXIT_LIMIT_S,
    EXIT_PROPERTY,
    MOMENTS,
    OUTPUTS,
    PAUSE_LIMIT_S,
    WITH_RUN,
    keep_one_worker,
    stress_project,
)

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: minutes of stage start-ups


@pytest.fixture(scope="module")
def queued(mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The stress project committed to git, and the plan that tells each experiment `stress-<i>` where to pause."""
    queue_project = stress_project(tmp_path_factory.mktemp("stress-queue") / "project", mnist_mirror)
    environment = stage_environment(mnist_mirror)
    committed = run_command(
        ["bash", "-c", "git add -A && git -c user.name=t -c user.email=t@e commit -qm baseline"],
        queue_project,
        environment,
    )
    assert committed.returncode == 0, committed.stderr
    plan = {f"stress-{index}": f"train:{moment}" for index, moment in enumerate(MOMENTS)}
    (queue_project.parent / "plan.json").write_text(json.dumps(plan))
    yield queue_project
    kill_processes_in(queue_project)


STATUS_LIMIT_S = 30.0  # until `dvc queue status` says Failed: dvc starts included


def _kill_and_check(project: Path, environment: dict[str, str], name: str, moment: str) -> float:
    """`dvc queue kill` the experiment paused at `moment`: its stage gone within 10 s of the kill command's start
    (returned: the seconds that took, polled as for the other paths), the experiment Failed in `dvc queue status`
    soon after (each status call is a `dvc` start of ~2 s, so that is polled within a wider STATUS_LIMIT_S), and
    its run KILLED if it had one."""
    stages = processes_running(project, b"stages.train")  # in the project or an experiment copy of it
    assert stages, f"no paused train stage of {name} found"
    signalled = time.monotonic()
    killed = run_command(["dvc", "queue", "kill", name], project, environment, limit_s=60)
    assert killed.returncode == 0, killed.stderr[-2000:]
    while alive := [pid for pid in stages if pid in processes_running(project, b"stages.train")]:
        assert time.monotonic() - signalled < EXIT_LIMIT_S, (
            f"{name}'s stage {alive} still running {EXIT_LIMIT_S} s after"
        )
        time.sleep(0.02)
    gone_s = time.monotonic() - signalled
    while True:
        status = run_command(["dvc", "queue", "status"], project, environment, limit_s=60).stdout
        if "Failed" in next((line for line in status.splitlines() if name in line), ""):
            break
        assert time.monotonic() - signalled < STATUS_LIMIT_S, (
            f"{name} not marked Failed {STATUS_LIMIT_S} s after the kill:\n{status}"
        )
        time.sleep(0.3)
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    records: dict[str, list[str]] = {}
    for run in client.search_runs(experiments, filter_string=f"tags.`{EXPERIMENT_TAG}` = '{name}'"):
        records.setdefault(run.data.tags.get(STAGE_TAG, ""), []).append(run.info.status)
    # The run and its pipeline parent exist from the run's start on; the parent takes its children's status.
    assert records == ({"train": ["KILLED"], "pipeline": ["KILLED"]} if moment in WITH_RUN else {}), (moment, records)
    running = client.search_runs(experiments, "attributes.status = 'RUNNING'")
    assert [run.info.run_name for run in running] == [], moment
    return gone_s


def test_dvc_queue_kill_stops_each_queued_experiment_cleanly_at_every_moment(
    queued: Path, mnist_mirror: Path, record_property: Callable[[str, object], None]
) -> None:
    environment = stage_environment(mnist_mirror, {"LAB_PAUSE_PLAN": str(queued.parent / "plan.json")})
    logs = queued / ".dvc" / "tmp" / "exps" / "run"
    worker_starts: list[float] = []
    workspace = {
        relative: (queued / relative).stat().st_mtime_ns for relative in OUTPUTS if (queued / relative).exists()
    }
    # One experiment queued at a time: a worker leaves after the experiment it ran is killed, and one that had
    # already claimed the next (celery prefetches) would leave that one "Running" for ever.
    for index, moment in enumerate(MOMENTS):
        name = f"stress-{index}"
        command = ["dvc", "exp", "run", "--queue", "-n", name, "-S", f"train.seed={100 + index}", "train"]
        queued_one = run_command(command, queued, environment)
        assert queued_one.returncode == 0, queued_one.stderr[-2000:]
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not any(
            f"[paused at train:{moment}]" in path.read_text(errors="replace") for path in logs.rglob("*.out")
        ):
            keep_one_worker(queued, environment, worker_starts)
            assert time.monotonic() < deadline, f"{name} did not pause at {moment}"
            time.sleep(1.0)
        record_property(EXIT_PROPERTY, _kill_and_check(queued, environment, name, moment))
    shown = json.loads(run_command(["dvc", "exp", "show", "--json"], queued, environment).stdout)
    finished = [
        run["name"]
        for commit in shown
        for group in commit.get("experiments") or []
        for run in group["revs"]
        if run.get("name", "").startswith("stress-") and not run.get("error")
    ]
    assert finished == [], f"killed experiments left results: {finished}"
    # Experiments run in copies of their own: the workspace's outputs are as they were.
    assert {
        relative: (queued / relative).stat().st_mtime_ns for relative in OUTPUTS if (queued / relative).exists()
    } == workspace
