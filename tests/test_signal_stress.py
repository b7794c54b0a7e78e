"""Ctrl-C and SIGTERM at ten moments of a training stage, from before its imports to its commit point, through the
three ways a user stops one: the stage alone (`python -m stages.train`) and `dvc repro`'s whole process group (Ctrl-C in
a terminal) here, `dvc queue kill` for a queued experiment in test_signal_stress_queue.py (a module of its own, so
that `make test-stress` runs it on the second worker meanwhile).

The stage holds at each moment ($LAB_PAUSE_AT / $LAB_PAUSE_PLAN, pipeline.common.interrupts) and the signal is sent
from outside once it says so, so each case hits the same point every time. Every time: all processes gone within
10 s, no new output in place (the stage alone: none, its outputs removed first; `dvc repro`: the previous ones byte
for byte, dvc.yaml keeps them) nor a temp folder, and the MLflow run KILLED where one had been started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.projects import default_sigint, run_command, stage_environment
from tests.helpers.stress import (
    EXIT_PROPERTY,
    MOMENTS,
    SIGNALS,
    Stderr,
    check_left_nothing,
    output_bytes,
    remove_outputs,
    stress_project,
    train_runs,
)

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: minutes of stage start-ups


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    return stress_project(tmp_path_factory.mktemp("stress") / "project", mnist_mirror)


@pytest.mark.parametrize("moment", MOMENTS)
def test_the_stage_alone_stops_cleanly_at_every_moment(
    project: Path, mnist_mirror: Path, moment: str, record_property: Callable[[str, object], None]
) -> None:
    for signum in SIGNALS:
        remove_outputs(project)
        runs_before = len(train_runs(project))
        process = subprocess.Popen(
            [sys.executable, "-m", "stages.train"],
            cwd=project,
            env=stage_environment(mnist_mirror, {"LAB_PAUSE_AT": f"train:{moment}"}),
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        stderr = Stderr(process)
        stderr.wait_for_pause(moment)
        signalled = time.monotonic()
        process.send_signal(signum)
        text, gone_s = stderr.wait_all_gone(project, signalled)
        record_property(EXIT_PROPERTY, gone_s)
        assert process.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], text[-2000:]
        assert "no outputs were written" in text.split(f"[paused at train:{moment}]")[1], text[-2000:]
        check_left_nothing(project, moment, runs_before, text)


@pytest.mark.parametrize("moment", MOMENTS)
def test_dvc_repro_process_group_stops_cleanly_at_every_moment(
    project: Path, mnist_mirror: Path, moment: str, record_property: Callable[[str, object], None]
) -> None:
    """As Ctrl-C in a terminal does: the signal goes to `dvc repro` and the stage it runs, together."""
    for signum in SIGNALS:
        runs_before = len(train_runs(project))
        before = output_bytes(project)
        process = subprocess.Popen(
            ["dvc", "repro", "--force", "--single-item", "train"],
            cwd=project,
            env=stage_environment(mnist_mirror, {"LAB_PAUSE_AT": f"train:{moment}"}),
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
            start_new_session=True,
        )
        stderr = Stderr(process)
        stderr.wait_for_pause(moment)
        signalled = time.monotonic()
        os.killpg(process.pid, signum)
        text, gone_s = stderr.wait_all_gone(project, signalled)
        record_property(EXIT_PROPERTY, gone_s)
        assert process.returncode != 0, text[-2000:]
        check_left_nothing(project, moment, runs_before, text, before)
        # DVC recorded nothing for the stopped stage: it is out of date, and the next `dvc repro` runs it.
        status = run_command(["dvc", "status", "--json", "train"], project, stage_environment(mnist_mirror))
        assert status.returncode == 0 and "train" in json.loads(status.stdout), status.stdout + status.stderr
