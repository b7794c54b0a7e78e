"""Fixtures shared by every test module; plain helpers are in the package tests/helpers."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.projects import (
    COMMAND_LIMIT_S,
    build_reproduced,
    copy_project,
    run_command,
    session_digest,
    stage_environment,
    tiny_params,
)
from tests.helpers.repo import REPO_PARAMS, REPO_ROOT
from tests.helpers.rotation import ROTATING, ROTATION_VARIABLE, SLOTS, chosen_slot, runs
from tests.helpers.stress import exit_summary

# Every `dvc` command would also start `dvc daemon analytics` (a share of the suite's CPU worth saving:
# docs/measurements.md), which then fails to reach its server offline and leaves a temp file. The project turns it off
# (`core.analytics false` in .dvc/config); the variable also covers a test's project whose config lacks it.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


def mirror_path() -> Path:
    return Path(os.environ.get("MNIST_MIRROR") or REPO_ROOT.parent / "shared" / "mnist").resolve()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tree's digest taken before any test runs, in every test process (the reproduced project is published
    and found under it: tests/helpers/projects.py, `session_digest`)."""
    session_digest(session.config, mirror_path())


@pytest.fixture(scope="session")
def mnist_mirror() -> Path:
    """The offline copy of the official MNIST files (`../shared/mnist`, or $MNIST_MIRROR)."""
    path = mirror_path()
    if not (path / "train-images-idx3-ubyte.gz").is_file():
        pytest.fail(f"offline MNIST mirror not found at {path}; set MNIST_MIRROR to the folder holding the IDX files")
    return path


@pytest.fixture(scope="session")
def reproduced_project(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path
) -> Path:
    """One project copy after `dvc repro` of the whole pipeline with the tiny params, run once per test run.

    Read-only: a test module that needs the pipeline's outputs clones it (`clone_project`), and a test that
    changes its module's copy clones that in turn. Running the pipeline once instead of once per module is
    most of what keeps `make test` within minutes on two cores. With pytest-xdist the workers share it: the
    first to need it builds it in the run's common temp folder under a file lock, the others wait for it
    (tests/conftest.py orders the modules so that they have other work meanwhile). Once built it is also
    published for a later session of the same tree (tests/browser/conftest.py).
    """
    return build_reproduced(request.config, tmp_path_factory, mnist_mirror)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The rotating tier's tests that `$LAB_ROTATION` leaves out this time deselected (tests/helpers/rotation.py);
    then the modules in the order that keeps the xdist workers (`--dist loadscope`: a module per worker at a time)
    busy: first the module whose worker builds the shared reproduced project (minutes) and has most to do after
    it, then every module that does not need that project (the other workers run them meanwhile), then the
    rest; within each group the long modules first, so that no worker is left with a long one at the end
    (LONG_MODULES, measured). Within a module the order is unchanged. Deterministic, as xdist requires."""
    slot = _rotation_slot(config)

    def chosen(item: pytest.Item) -> bool:
        return runs(item.nodeid.split("::")[0], slot, {mark.name for mark in item.iter_markers()})

    left_out = [item for item in items if not chosen(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if chosen(item)]
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    needing = {
        module
        for module, found in modules.items()
        if any("reproduced_project" in getattr(item, "fixturenames", ()) for item in found)
    }

    def longest_first(group: list[str]) -> list[str]:
        return sorted(
            group, key=lambda module: LONG_MODULES.index(module) if module in LONG_MODULES else len(LONG_MODULES)
        )

    dependent = longest_first([module for module in modules if module in needing])
    order = dependent[:1] + longest_first([module for module in modules if module not in needing]) + dependent[1:]
    items[:] = [item for module in order for item in modules[module]]


# The longest modules, longest first (`make test` on two workers, each module's seconds on its worker:
# docs/measurements.md): the first that needs the shared reproduced project builds it.
LONG_MODULES = (
    "tests/test_swap_stress.py",  # `make test-stress` only: about 24 minutes
    "tests/test_benchmarks.py",
    "tests/test_profile.py",
    "tests/test_report_inputs.py",
    "tests/test_tracking_store.py",
    "tests/test_machines_server.py",
    "tests/test_tracking_server.py",
    "tests/test_last_good_results.py",
    "tests/test_train_stage.py",
    "tests/test_report.py",
    "tests/test_timing_calibration.py",
    "tests/test_queue.py",
    "tests/test_signals.py",
    "tests/test_device_kinds.py",
    "tests/test_class_server.py",
    "tests/test_hostile_params.py",
    "tests/test_hostile_files.py",
    "tests/test_sharing.py",
    "tests/test_training.py",
    "tests/test_download_stage.py",
)


def _rotation_slot(config: pytest.Config) -> int | None:
    try:
        return chosen_slot(os.environ.get(ROTATION_VARIABLE, ""))
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_report_header(config: pytest.Config) -> str | None:
    slot = _rotation_slot(config)
    if slot is None:
        return None
    left = sorted(module for module, found in ROTATING.items() if found != slot)
    return (
        f"rotating tier: slot {slot} of {SLOTS} ({ROTATION_VARIABLE}={os.environ[ROTATION_VARIABLE]}); the slow and "
        f"browser tests of these modules are left out this time, run by the next two commits and by `make test-all`: "
        f"{', '.join(left)}"
    )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After a signal stress run (`make test-stress`): how long each path took to stop, from the recorded stops."""
    reports = [report for key in ("passed", "failed") for report in terminalreporter.stats.get(key, [])]
    lines = exit_summary([report for report in reports if getattr(report, "when", "") == "call"])
    if lines:
        terminalreporter.write_sep("-", "signal stress: seconds from the signal until every process was gone")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def signal_handlers_restored() -> Iterator[None]:
    """A stage run in process (run_stage) installs its SIGINT/SIGTERM handlers, which end the process at once once
    the stage is over: each test gets the test process's own back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


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
