"""The last good results stay, whatever stops `dvc repro` of the train, profile@cpu and report stages: SIGINT and
SIGTERM, single and doubled (a second one 0.3 s later, during the cleanup the first started), and a failure
injected at the same point, at each of the stage's ten named moments (pipeline.common.interrupts: $LAB_PAUSE_AT,
$LAB_FAIL_AT).

Every time: every output byte for byte as before, no temp file left, every process gone within 10 s, a non-zero
exit, no MLflow run of the stage left RUNNING (nor a profile run made current for outputs that never landed), and
DVC still sees the stage as changed. The train stage's single signals are in tests/test_signal_stress.py, with the
stage-alone path; here it gets the doubled ones and the failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.tracking.tags import OUTPUTS_TAG
from tests.helpers.projects import (
    default_sigint,
    read_params,
    reproduced_or_published,
    run_command,
    stage_environment,
    write_params,
)
from tests.helpers.stress import ALL_MOMENTS, EXIT_PROPERTY, Stderr, chosen_moments, chosen_stages

pytestmark = [pytest.mark.slow, pytest.mark.stress]  # `make test-stress`: minutes of stage start-ups

SECOND_SIGNAL_S = 0.3


@dataclass(frozen=True)
class Stage:
    name: str  # as $LAB_PAUSE_AT and the runs' `stage` tag name it
    target: str  # what `dvc repro` is given
    moments: tuple[str, ...]  # in the order a run reaches them
    outputs: tuple[str, ...]  # files and folders, every file under a folder compared
    kinds: tuple[str, ...]


ALL_KINDS = ("SIGINT", "SIGTERM", "SIGINT twice", "SIGTERM twice", "failure")
STAGES = (
    Stage(
        "report",
        "report",
        (
            "start-up",
            "imported",
            "params-loaded",
            "run-started",
            "report-built",
            "html-rendered",
            "handins-written",
            "figures-logged",
            "logged",
            "commit",
        ),
        ("report", "plots/profile_comparison.csv"),
        ALL_KINDS,
    ),
    Stage(
        "profile",
        "profile@cpu",
        (
            "start-up",
            "imported",
            "server-forked",
            "prepared",
            "timed",
            "traced",
            "comparisons-written",
            "logging",
            "logged",
            "commit",
        ),
        ("profiles/cpu", "traces/cpu", "metrics/profile_cpu.json"),
        ALL_KINDS,
    ),
    Stage(
        "train",
        "train",
        ALL_MOMENTS,
        ("models/model.pt", "metrics/train.json", "metrics/train_speed.json", "plots/train_steps.csv"),
        ("SIGINT twice", "SIGTERM twice", "failure"),
    ),
)
# $LAB_STRESS_MOMENTS picks moments by position (CI's rotating sample names train's; the same places in each stage).
CASES = [
    pytest.param(stage, stage.moments[ALL_MOMENTS.index(moment)], id=f"{stage.name}-{moment}")
    for stage in STAGES
    if stage.name in chosen_stages(os.environ.get("LAB_STRESS_STAGES", ""))
    for moment in chosen_moments(os.environ.get("LAB_STRESS_MOMENTS", ""))
]


@pytest.fixture(scope="module")
def project(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """The tiny pipeline reproduced to its report (the one `make test` published for this tree, where it did), then
    set to profile batch 1 and 16 only and to train on 1,280 images: every late moment waits for the work before
    it, so it is kept short."""
    project = reproduced_or_published(
        request.config, tmp_path_factory.mktemp("stress-stages") / "project", mnist_mirror
    )
    params = read_params(project)
    params["train"].update(train_samples=1280, test_samples=1000)
    params["profile"].update(batch_sizes=[1, 16])
    write_params(project, params)
    return project


def output_bytes(project: Path, stage: Stage) -> dict[str, bytes]:
    """Every file of the stage's outputs, by its path in the project."""
    found = {}
    for relative in stage.outputs:
        path = project / relative
        files = sorted(item for item in path.rglob("*") if item.is_file()) if path.is_dir() else [path]
        found.update({str(file.relative_to(project)): file.read_bytes() for file in files if file.exists()})
    return found


def stage_runs(project: Path, stage: Stage) -> list[tuple[str, str, str]]:
    """(run id, status, lineage tag) of every run of the stage, newest first."""
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.stage = '{stage.name}'")
    return [(run.info.run_id, run.info.status, run.data.tags.get(OUTPUTS_TAG, "")) for run in runs]


def stop(process: subprocess.Popen[str], kind: str) -> None:
    """As Ctrl-C in a terminal or a `kill` of the job does: the signal to `dvc repro` and its stage together."""
    signum = signal.SIGINT if kind.startswith("SIGINT") else signal.SIGTERM
    os.killpg(process.pid, signum)
    if kind.endswith("twice"):
        time.sleep(SECOND_SIGNAL_S)
        if process.poll() is None:
            os.killpg(process.pid, signum)


@pytest.mark.parametrize(("stage", "moment"), CASES)
def test_dvc_repro_keeps_the_last_good_outputs_whatever_stops_it(
    project: Path, mnist_mirror: Path, stage: Stage, moment: str, record_property: Callable[[str, object], None]
) -> None:
    for kind in stage.kinds:
        before = output_bytes(project, stage)
        runs_before = {run_id for run_id, _, _ in stage_runs(project, stage)}
        current_before = {run_id for run_id, _, tag in stage_runs(project, stage) if tag == "current"}
        where = f"{stage.name}:{moment}"
        variable = "LAB_FAIL_AT" if kind == "failure" else "LAB_PAUSE_AT"
        process = subprocess.Popen(
            ["dvc", "repro", "--force", "--single-item", stage.target],
            cwd=project,
            env=stage_environment(mnist_mirror, {variable: where}),
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
            start_new_session=True,
        )
        stderr = Stderr(process)
        if kind == "failure":
            signalled = time.monotonic()
            process.wait(timeout=300)
        else:
            stderr.wait_for_pause(where.partition(":")[2], stage.name)
            signalled = time.monotonic()
            stop(process, kind)
        text, gone_s = stderr.wait_all_gone(project, signalled)
        if kind != "failure":
            record_property(EXIT_PROPERTY, gone_s)
        case = f"{kind} at {where}:\n{text[-3000:]}"
        assert process.returncode != 0, case
        if kind == "failure":
            assert "failure injected at" in text, case
        else:
            assert "Traceback" not in text, case
        changed = sorted(set(before) ^ set(output_bytes(project, stage)))
        changed += sorted(name for name, old in before.items() if output_bytes(project, stage).get(name) != old)
        assert changed == [], (changed, case)
        assert list(project.rglob(".partial-*")) == [], case
        runs = stage_runs(project, stage)
        assert [run_id for run_id, status, _ in runs if status == "RUNNING"] == [], case
        new_current = {run_id for run_id, _, tag in runs if tag == "current" and run_id not in runs_before}
        assert new_current == set(), case  # no run of outputs that never landed became the current one
        assert {run_id for run_id, _, tag in runs if tag == "current"} == current_before, case
        status = run_command(["dvc", "status", "--json", stage.target], project, stage_environment(mnist_mirror))
        assert status.returncode == 0 and stage.target in json.loads(status.stdout), status.stdout + status.stderr
