"""The last good results stay: a stage stopped (SIGINT, SIGTERM, through `dvc repro`'s process group) or failing at
any moment leaves its previous complete outputs byte for byte, cached or not (dvc.yaml: `persist`), and the next
`dvc repro` reruns it. On a clone of the reproduced project, through the real `dvc` CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.helpers.projects import clone_project, default_sigint, processes_in, run_command, stage_environment

pytestmark = pytest.mark.slow
REPORT_OUTPUTS = ("report", "plots/profile_comparison.csv")
PROFILE_OUTPUTS = ("profiles/cpu", "traces/cpu", "metrics/profile_cpu.json")
PAUSE_LIMIT_S = 180.0
EXIT_LIMIT_S = 20.0


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, reproduced_project: Path) -> Path:
    return clone_project(reproduced_project, tmp_path_factory.mktemp("last-good") / "project")


def _files(project: Path, relatives: tuple[str, ...]) -> dict[str, bytes]:
    """Every file of these outputs (a file or a folder's files), by path, with its bytes."""
    found = {}
    for relative in relatives:
        root = project / relative
        for path in [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()):
            found[str(path.relative_to(project))] = path.read_bytes()
    return found


def _stopped(project: Path, mnist_mirror: Path, arguments: list[str], moment: str, signum: int, times: int = 1) -> str:
    """`dvc <arguments>` paused at `moment` (`stage:moment`), then `signum` to its process group `times` times, 0.3 s
    apart (a user who insists, during the cleanup the first started): its stderr, once every process in the project
    is gone."""
    process = subprocess.Popen(
        ["dvc", *arguments],
        cwd=project,
        env=stage_environment(mnist_mirror, {"LAB_PAUSE_AT": moment}),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
        start_new_session=True,
    )
    assert process.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not any(f"[paused at {moment}]" in line for line in list(lines)):
        assert process.poll() is None, f"ended before pausing at {moment}:\n{''.join(lines)[-3000:]}"
        assert time.monotonic() < deadline, f"not paused at {moment}:\n{''.join(lines)[-3000:]}"
        time.sleep(0.05)
    os.killpg(process.pid, signum)
    signalled = time.monotonic()
    for _ in range(times - 1):
        time.sleep(0.3)
        if process.poll() is None:
            os.killpg(process.pid, signum)
    while process.poll() is None or processes_in(project):
        assert time.monotonic() - signalled < EXIT_LIMIT_S, "".join(lines)[-3000:]
        time.sleep(0.05)
    reader.join(timeout=5)
    assert process.returncode != 0, "".join(lines)[-3000:]
    return "".join(lines)


def _out_of_date(project: Path, mnist_mirror: Path, stage: str) -> bool:
    status = run_command(["dvc", "status", "--json", stage], project, stage_environment(mnist_mirror))
    assert status.returncode == 0, status.stderr
    return stage in json.loads(status.stdout)


def _newest_status(project: Path, stage: str) -> str:
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    (newest, *_) = client.search_runs(
        [experiment.experiment_id], f"tags.stage = '{stage}'", order_by=["attributes.start_time DESC"]
    )
    return str(newest.info.status)


@pytest.mark.parametrize(
    ("moment", "signum", "times"),
    [("imported", signal.SIGINT, 1), ("commit", signal.SIGTERM, 1), ("commit", signal.SIGINT, 1),
     ("commit", signal.SIGTERM, 2)],
    ids=["imported-SIGINT", "commit-SIGTERM", "commit-SIGINT", "commit-SIGTERM-twice"],
)  # fmt: skip
def test_a_report_stopped_in_dvc_repro_leaves_the_last_report_byte_for_byte(
    project: Path, mnist_mirror: Path, moment: str, signum: int, times: int
) -> None:
    catalogue = project / "pipeline/report/messages/en.toml"
    # A dep of the report changed: `dvc repro report` runs it.
    catalogue.write_text(catalogue.read_text() + f"\n# changed: {moment} {signum} {times}\n")
    before = _files(project, REPORT_OUTPUTS)
    assert "report/report.md" in before and "plots/profile_comparison.csv" in before
    stderr = _stopped(project, mnist_mirror, ["repro", "report"], f"report:{moment}", signum, times)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert _files(project, REPORT_OUTPUTS) == before
    assert list(project.rglob(".partial-*")) == []
    if moment == "commit":  # the run had started: it ended KILLED
        assert _newest_status(project, "report") == "KILLED"
    assert _out_of_date(project, mnist_mirror, "report")  # DVC recorded nothing: the next `dvc repro` reruns it


def test_a_failing_report_leaves_the_last_report_byte_for_byte(project: Path, mnist_mirror: Path) -> None:
    catalogue = project / "pipeline/report/messages/en.toml"
    saved = catalogue.read_text()
    before = _files(project, REPORT_OUTPUTS)
    assert "report/report.md" in before and "plots/profile_comparison.csv" in before
    catalogue.write_text(saved + "\n[broken\n")  # not TOML
    try:
        result = run_command(["dvc", "repro", "report"], project, stage_environment(mnist_mirror))
    finally:
        catalogue.write_text(saved)
    assert result.returncode != 0, result.stdout + result.stderr
    assert _files(project, REPORT_OUTPUTS) == before


def test_a_profile_stopped_in_dvc_repro_leaves_its_last_profiles_and_traces(project: Path, mnist_mirror: Path) -> None:
    before = _files(project, PROFILE_OUTPUTS)
    assert any(name.startswith("traces/cpu/") for name in before) and "metrics/profile_cpu.json" in before
    stderr = _stopped(project, mnist_mirror, ["repro", "-s", "-f", "profile@cpu"], "profile:imported", signal.SIGINT)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert _files(project, PROFILE_OUTPUTS) == before
    assert list(project.rglob(".partial-*")) == []
