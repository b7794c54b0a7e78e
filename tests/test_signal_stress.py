"""Ctrl-C and SIGTERM at ten moments of a training stage, from before its imports to its commit point, through the
three ways a user stops one: the stage alone (`python -m stages.train`), `dvc repro`'s whole process group (Ctrl-C in
a terminal), and `dvc queue kill` for a queued experiment.

The stage holds at each moment ($LAB_PAUSE_AT / $LAB_PAUSE_PLAN, pipeline.common.interrupts) and the signal is sent
from outside once it says so, so each case hits the same point every time. Every time: all processes gone within
10 s, no output in place (nor a temp folder), and the MLflow run KILLED where one had been started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipeline.tracking.tags import EXPERIMENT_TAG
from tests.helpers.projects import (
    clone_project,
    default_sigint,
    kill_processes_in,
    processes_in,
    read_params,
    run_command,
    stage_environment,
    write_params,
)

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: minutes of stage start-ups

# In the order a run of the train stage reaches them (stages/__init__.py, stage_runner.py, stages/train.py,
# pipeline/training/loop.py, pipeline/common/outputs.py).
MOMENTS = (
    "start-up",
    "imported",
    "loaded",
    "run-started",
    "setup-logged",
    "training",
    "trained",
    "model-logged",
    "outputs-staged",
    "commit",
)
WITH_RUN = set(MOMENTS[MOMENTS.index("run-started") :])
EXIT_LIMIT_S = 10.0
PAUSE_LIMIT_S = 120.0  # to reach a moment: imports, training (slow on a loaded machine)
OUTPUTS = ("models/model.pt", "metrics/train.json", "metrics/train_speed.json", "plots/train_steps.csv")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    """The reproduced project with a training of 20 log windows of one step (1,280 images) evaluated on 1,000 test
    images: every moment after "loaded" waits for this much training, so it is kept short."""
    project = clone_project(reproduced_project, tmp_path_factory.mktemp("stress") / "project")
    params = read_params(project)
    params["train"].update(train_samples=1280, test_samples=1000, log_every_steps=1)
    write_params(project, params)
    return project


def _train_runs(project: Path) -> list[Any]:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")


def _remove_outputs(project: Path) -> None:
    for relative in OUTPUTS:
        (project / relative).unlink(missing_ok=True)


class _Stderr:
    """A child's stderr, read by a thread of its own so that the test can poll it without blocking."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stderr is not None
        self.process = process
        self.lines: list[str] = []
        stream = process.stderr
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._reader.start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for_pause(self, moment: str) -> None:
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not any(f"[paused at train:{moment}]" in line for line in list(self.lines)):
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                pytest.fail(f"ended before pausing at {moment} (exit {self.process.returncode}):\n{self.text[-3000:]}")
            assert time.monotonic() < deadline, f"not paused at {moment} after {PAUSE_LIMIT_S} s:\n{self.text[-3000:]}"
            time.sleep(0.02)

    def wait_all_gone(self, project: Path, signalled: float) -> str:
        """All of stderr once the process and every other process working in `project` are gone (≤ 10 s)."""
        while self.process.poll() is None or processes_in(project):
            assert time.monotonic() - signalled < EXIT_LIMIT_S, (
                f"still running {EXIT_LIMIT_S} s after the signal: {processes_in(project)}\n{self.text[-3000:]}"
            )
            time.sleep(0.02)
        self._reader.join(timeout=5)
        return self.text


def _check_left_nothing(project: Path, moment: str, runs_before: int, stderr: str) -> None:
    assert not [relative for relative in OUTPUTS if (project / relative).exists()], stderr[-3000:]
    assert list(project.rglob(".partial-*")) == [] and not list((project / "models").glob(".*partial*"))
    assert "Traceback" not in stderr, stderr[-3000:]
    runs = _train_runs(project)
    if moment in WITH_RUN:
        assert len(runs) == runs_before + 1, stderr[-3000:]
        assert runs[0].info.status == "KILLED", (runs[0].info.status, stderr[-3000:])
        # No registry version for a stopped run (issue 28): a model is registered only after the commit point.
        assert "model.registered_version" not in runs[0].data.tags, stderr[-3000:]
        registered = MlflowClient(f"sqlite:///{project / 'mlflow.db'}").search_model_versions(
            f"run_id = '{runs[0].info.run_id}'"
        )
        assert registered == [], [version.version for version in registered]
    else:
        assert len(runs) == runs_before, stderr[-3000:]


@pytest.mark.parametrize("moment", MOMENTS)
def test_the_stage_alone_stops_cleanly_at_every_moment(project: Path, mnist_mirror: Path, moment: str) -> None:
    for signum in SIGNALS:
        _remove_outputs(project)
        runs_before = len(_train_runs(project))
        process = subprocess.Popen(
            [sys.executable, "-m", "stages.train"],
            cwd=project,
            env=stage_environment(mnist_mirror, {"LAB_PAUSE_AT": f"train:{moment}"}),
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        stderr = _Stderr(process)
        stderr.wait_for_pause(moment)
        signalled = time.monotonic()
        process.send_signal(signum)
        text = stderr.wait_all_gone(project, signalled)
        assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], text[-2000:]
        assert "no outputs were written" in text.split(f"[paused at train:{moment}]")[1], text[-2000:]
        _check_left_nothing(project, moment, runs_before, text)


@pytest.mark.parametrize("moment", MOMENTS)
def test_dvc_repro_process_group_stops_cleanly_at_every_moment(project: Path, mnist_mirror: Path, moment: str) -> None:
    """As Ctrl-C in a terminal does: the signal goes to `dvc repro` and the stage it runs, together."""
    for signum in SIGNALS:
        runs_before = len(_train_runs(project))
        process = subprocess.Popen(
            ["dvc", "repro", "--force", "--single-item", "train"],
            cwd=project,
            env=stage_environment(mnist_mirror, {"LAB_PAUSE_AT": f"train:{moment}"}),
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
            start_new_session=True,
        )
        stderr = _Stderr(process)
        stderr.wait_for_pause(moment)
        signalled = time.monotonic()
        os.killpg(process.pid, signum)
        text = stderr.wait_all_gone(project, signalled)
        assert process.returncode != 0, text[-2000:]
        _check_left_nothing(project, moment, runs_before, text)
        # DVC recorded nothing for the stopped stage: it is out of date, and the next `dvc repro` runs it.
        status = run_command(["dvc", "status", "--json", "train"], project, stage_environment(mnist_mirror))
        assert status.returncode == 0 and "train" in json.loads(status.stdout), status.stdout + status.stderr


@pytest.fixture(scope="module")
def queued(project: Path, mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A clone of `project` committed to git, and the plan that tells each experiment `stress-<i>` where to pause."""
    queue_project = clone_project(project, tmp_path_factory.mktemp("stress-queue") / "project")
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


WORKER_START_S = 30.0  # a started worker shows in `dvc queue status` only once celery is up


def _keep_one_worker(project: Path, environment: dict[str, str], last_start: list[float]) -> None:
    """One queue worker, so that the experiments run one after the other: a worker may leave once the experiment
    it ran was killed (DVC 3.x), and a user starts one again for the rest. Not again while one is starting."""
    if last_start and time.monotonic() - last_start[-1] < WORKER_START_S:
        return
    status = run_command(["dvc", "queue", "status"], project, environment, limit_s=60).stdout
    if "Worker status: 0 active, 0 idle" in status:
        last_start.append(time.monotonic())
        started = run_command(["dvc", "queue", "start", "-j", "1"], project, environment, limit_s=60)
        assert started.returncode == 0, started.stderr[-2000:]


def _kill_and_check(project: Path, environment: dict[str, str], name: str, moment: str) -> None:
    """`dvc queue kill` the experiment paused at `moment`: failed within 10 s, its run KILLED if it had one."""
    signalled = time.monotonic()
    killed = run_command(["dvc", "queue", "kill", name], project, environment, limit_s=60)
    assert killed.returncode == 0, killed.stderr[-2000:]
    while True:
        status = run_command(["dvc", "queue", "status"], project, environment, limit_s=60).stdout
        if "Failed" in next((line for line in status.splitlines() if name in line), ""):
            break
        assert time.monotonic() - signalled < EXIT_LIMIT_S, (
            f"{name} not stopped {EXIT_LIMIT_S} s after the kill:\n{status}"
        )
        time.sleep(0.3)
    runs = [run for run in _train_runs(project) if run.data.tags.get(EXPERIMENT_TAG) == name]
    assert [run.info.status for run in runs] == (["KILLED"] if moment in WITH_RUN else []), (moment, runs)


def test_dvc_queue_kill_stops_each_queued_experiment_cleanly_at_every_moment(queued: Path, mnist_mirror: Path) -> None:
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
            _keep_one_worker(queued, environment, worker_starts)
            assert time.monotonic() < deadline, f"{name} did not pause at {moment}"
            time.sleep(1.0)
        _kill_and_check(queued, environment, name, moment)
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
