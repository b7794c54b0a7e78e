"""Fixtures shared by every test module; plain helpers are in the package tests/helpers."""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.projects import (
    COMMAND_LIMIT_S,
    copy_project,
    reproduced_copy,
    run_command,
    stage_environment,
    tiny_params,
)
from tests.helpers.repo import REPO_PARAMS, REPO_ROOT


@pytest.fixture(scope="session")
def mnist_mirror() -> Path:
    """The offline copy of the official MNIST files (`../shared/mnist`, or $MNIST_MIRROR)."""
    path = Path(os.environ.get("MNIST_MIRROR") or REPO_ROOT.parent / "shared" / "mnist").resolve()
    if not (path / "train-images-idx3-ubyte.gz").is_file():
        pytest.fail(f"offline MNIST mirror not found at {path}; set MNIST_MIRROR to the folder holding the IDX files")
    return path


@pytest.fixture(scope="session")
def reproduced_project(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """One project copy after `dvc repro` of the whole pipeline with the tiny params, run once per test run.

    Read-only: a test module that needs the pipeline's outputs clones it (`clone_project`), and a test that
    changes its module's copy clones that in turn. Running the pipeline once instead of once per module is
    most of what keeps `make test` within minutes on two cores.
    """
    return reproduced_copy(tmp_path_factory.mktemp("reproduced") / "project", mnist_mirror)


@pytest.fixture
def repo_params() -> dict[str, Any]:
    """params.yaml of the repository as a plain mapping, to be modified by a test."""
    return copy.deepcopy(REPO_PARAMS)


@pytest.fixture
def tiny_params_mapping() -> dict[str, Any]:
    """params.yaml with the one tiny configuration of tests/helpers.py::tiny_params, to be modified by a test."""
    return tiny_params(copy.deepcopy(REPO_PARAMS))


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture
def run_in(mnist_mirror: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a command in a project copy with the venv on PATH and the offline mirror set."""

    def run(
        project: Path, *command: str, env: dict[str, str] | None = None, limit_s: float = COMMAND_LIMIT_S
    ) -> subprocess.CompletedProcess[str]:
        return run_command(list(command), project, stage_environment(mnist_mirror, env), limit_s)

    return run
