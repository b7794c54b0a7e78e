"""What the signal stress tests share (tests/test_signal_stress*.py, `make test-stress`): the moments a train stage
pauses at, the project they stop it in, and the checks that a stop left nothing behind."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from tests.helpers.projects import (
    processes_in,
    processes_running,
    read_params,
    reproduced_copy,
    run_command,
    write_params,
)

# In the order a run of the train stage reaches them (stages/__init__.py, stage_runner.py, stages/train.py,
# pipeline/training/loop.py, pipeline/common/outputs.py).
ALL_MOMENTS = (
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
WITH_RUN = set(ALL_MOMENTS[ALL_MOMENTS.index("run-started") :])


def chosen_moments(value: str) -> tuple[str, ...]:
    """The moments the stress tests stop at: all of them, or those $LAB_STRESS_MOMENTS lists (comma-separated;
    CI's rotating one, `make test-stress-sample`)."""
    if not value.strip():
        return ALL_MOMENTS
    chosen = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in chosen if name not in ALL_MOMENTS]
    if unknown:
        raise pytest.UsageError(f"LAB_STRESS_MOMENTS names no moment {unknown}; the moments: {', '.join(ALL_MOMENTS)}")
    return chosen


def moment_for(commits: int) -> str:
    """CI's sample: one moment per commit, from the number of commits up to it (`git rev-list --count HEAD`), so
    that any ten consecutive commits cover all of them."""
    return ALL_MOMENTS[commits % len(ALL_MOMENTS)]


MOMENTS = chosen_moments(os.environ.get("LAB_STRESS_MOMENTS", ""))
# The stages tests/test_signal_stress_stages.py stops through `dvc repro`; $LAB_STRESS_STAGES may name some of them.
STAGE_NAMES = ("report", "profile", "train")


def stage_for(commits: int) -> str:
    """CI's sample of the stages: one per commit, with moment_for, so that any 30 consecutive commits cover every
    stage at every moment."""
    return STAGE_NAMES[commits % len(STAGE_NAMES)]


def chosen_stages(value: str) -> tuple[str, ...]:
    chosen = tuple(name.strip() for name in value.split(",") if name.strip()) or STAGE_NAMES
    unknown = [name for name in chosen if name not in STAGE_NAMES]
    if unknown:
        raise pytest.UsageError(f"LAB_STRESS_STAGES names no stage {unknown}; the stages: {', '.join(STAGE_NAMES)}")
    return chosen


EXIT_LIMIT_S = 10.0
PAUSE_LIMIT_S = 120.0  # to reach a moment: imports, training (slow on a loaded machine)
OUTPUTS = ("models/model.pt", "metrics/train.json", "metrics/train_speed.json", "plots/train_steps.csv")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stress_project(target: Path, mnist_mirror: Path) -> Path:
    """A project after `dvc repro train` with the tiny params (validate, download, train: the stages the cases
    run, not the whole pipeline), then set to train 20 log windows of one step (1,280 images) evaluated on 1,000
    test images: every moment after "loaded" waits for this much training, so it is kept short."""
    project = reproduced_copy(target, mnist_mirror, stage="train")
    params = read_params(project)
    params["train"].update(train_samples=1280, test_samples=1000, log_every_steps=1)
    write_params(project, params)
    return project


def train_runs(project: Path) -> list[Any]:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    return client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'train'")


def remove_outputs(project: Path) -> None:
    for relative in OUTPUTS:
        (project / relative).unlink(missing_ok=True)


class Stderr:
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

    def wait_for_pause(self, moment: str, stage: str = "train") -> None:
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not any(f"[paused at {stage}:{moment}]" in line for line in list(self.lines)):
            if self.process.poll() is not None:
                self._reader.join(timeout=5)
                pytest.fail(f"ended before pausing at {moment} (exit {self.process.returncode}):\n{self.text[-3000:]}")
            assert time.monotonic() < deadline, f"not paused at {moment} after {PAUSE_LIMIT_S} s:\n{self.text[-3000:]}"
            time.sleep(0.02)

    def wait_all_gone(self, project: Path, signalled: float) -> tuple[str, float]:
        """All of stderr once the process and every other process working in `project` are gone (≤ 10 s), and the
        seconds that took from the signal."""
        while self.process.poll() is None or processes_in(project):
            assert time.monotonic() - signalled < EXIT_LIMIT_S, (
                f"still running {EXIT_LIMIT_S} s after the signal: {processes_in(project)}\n{self.text[-3000:]}"
            )
            time.sleep(0.02)
        gone_s = time.monotonic() - signalled
        self._reader.join(timeout=5)
        return self.text, gone_s


def output_bytes(project: Path) -> dict[str, bytes | None]:
    """The train stage's outputs as they are: each one's bytes, None where it does not exist."""
    paths = {relative: project / relative for relative in OUTPUTS}
    return {relative: path.read_bytes() if path.exists() else None for relative, path in paths.items()}


def check_left_nothing(
    project: Path, moment: str, runs_before: int, stderr: str, before: dict[str, bytes | None] | None = None
) -> None:
    """The stop wrote nothing: every output as it was `before` (byte for byte; dvc.yaml keeps them, `persist`), or
    absent where no `before` is given (the stage alone, its outputs removed first)."""
    if before is None:
        assert not [relative for relative in OUTPUTS if (project / relative).exists()], stderr[-3000:]
    else:
        changed = [name for name, old in output_bytes(project).items() if old != before[name]]
        assert changed == [], stderr[-3000:]
    assert list(project.rglob(".partial-*")) == [] and not list((project / "models").glob(".*partial*"))
    assert "Traceback" not in stderr, stderr[-3000:]
    runs = train_runs(project)
    if moment in WITH_RUN:
        assert len(runs) == runs_before + 1, stderr[-3000:]
        assert runs[0].info.status == "KILLED", (runs[0].info.status, stderr[-3000:])
        # No registry version for a stopped run: a model is registered only after the commit point.
        assert "model.registered_version" not in runs[0].data.tags, stderr[-3000:]
        registered = MlflowClient(f"sqlite:///{project / 'mlflow.db'}").search_model_versions(
            f"run_id = '{runs[0].info.run_id}'"
        )
        assert registered == [], [version.version for version in registered]
    else:
        assert len(runs) == runs_before, stderr[-3000:]


EXIT_PROPERTY = "stop_exit_s"  # recorded per stop (`record_property`), summed up by tests/conftest.py


def exit_summary(reports: list[Any]) -> list[str]:
    """One line per stress test function: the seconds from a signal until every process was gone, over its stops
    (the README quotes them); nothing when no stress test ran."""
    seconds: dict[str, list[float]] = {}
    for report in reports:
        name = report.nodeid.split("::")[-1].split("[")[0]
        seconds.setdefault(name, []).extend(value for key, value in report.user_properties if key == EXIT_PROPERTY)
    return [
        f"{name}: {len(values)} stops, gone {statistics.median(values):.2f} s after the signal "
        f"(median; {min(values):.2f}-{max(values):.2f} s, limit {EXIT_LIMIT_S:.0f} s)"
        for name, values in sorted(seconds.items())
        if values
    ]


# A worker `dvc queue start` spawned shows in /proc once the command returns; this covers its first seconds.
WORKER_START_S = 5.0


def keep_one_worker(project: Path, environment: dict[str, str], starts: list[float]) -> None:
    """One queue worker, so that queued experiments run one after the other: `dvc queue kill` may end the worker
    too (treeverse/dvc#10562), and a user starts one again for the rest. Not again while one is starting."""
    if starts and time.monotonic() - starts[-1] < WORKER_START_S:
        return
    if not processes_running(project, b"queue-worker"):  # DVC's `dvc exp queue-worker`
        starts.append(time.monotonic())
        started = run_command(["dvc", "queue", "start", "-j", "1"], project, environment, limit_s=60)
        assert started.returncode == 0, started.stderr[-2000:]
