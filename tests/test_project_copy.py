"""A project copied (`cp -r`) or moved writes only into itself: its store's artifact locations, kept absolute, are
pointed at the copy's own `mlartifacts/` by the first stage that opens it, saying so."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from tests.helpers.projects import clone_project, run_command, stage_environment


def _files(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


@pytest.mark.slow  # runs a stage that imports MLflow
def test_a_copied_project_logs_into_its_own_artifacts_not_the_original(
    reproduced_project: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    original = clone_project(reproduced_project, tmp_path / "original")  # the project a user copies, its store its own
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)  # `cp -r`: the store still names the original's folders
    before, copied = _files(original / "mlartifacts"), _files(copy / "mlartifacts")
    result = run_command([sys.executable, "-m", "stages.report"], copy, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    assert _files(original / "mlartifacts") == before, "the copy logged into the original"
    said = [line for line in result.stderr.splitlines() if "(the project it was copied or moved from)" in line]
    assert len(said) == 1 and f"{original / 'mlartifacts'}/" in said[0] and f"{copy / 'mlartifacts'}/" in said[0]
    with sqlite3.connect(copy / "mlflow.db") as store:
        locations = [row[0] for row in store.execute("SELECT artifact_uri FROM runs")]
        locations += [
            row[0] for row in store.execute("SELECT artifact_location FROM experiments WHERE name != 'Default'")
        ]
    store.close()
    assert locations and not [location for location in locations if str(original) in location], locations
    logged = _files(copy / "mlartifacts") - copied
    assert any(name.endswith("/report.md") for name in logged), sorted(logged)  # this run's, in the copy
    second = run_command([sys.executable, "-m", "stages.report"], copy, stage_environment(mnist_mirror))
    assert second.returncode == 0 and "copied or moved from" not in second.stderr  # mended once
