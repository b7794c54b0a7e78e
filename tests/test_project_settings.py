"""Project-wide settings: DVC's analytics are off for the project (every `dvc` call would otherwise start a
daemon that writes a report it cannot send offline), and the suite's own plumbing works under the pytest options
people use: `-p no:cacheprovider` (no `config.cache` at all) must not fail the shared reproduced project's
publishing (tests/helpers/projects.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.repo import REPO_ROOT

PROBE = """
from tests.helpers.projects import reproduced_cache

def test_probe(request):
    found = reproduced_cache(request.config)
    print("CACHE", "none" if found is None else found.name)
"""


@pytest.mark.parametrize(("options", "expected"), [(["-p", "no:cacheprovider"], "none"), ([], "reproduced")])
def test_the_published_projects_cache_is_none_without_pytests_cache_plugin(
    tmp_path: Path, options: list[str], expected: str
) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:randomly", *options, "test_probe.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"CACHE {expected}" in result.stdout


def test_dvc_analytics_are_off_for_the_project_whatever_the_environment() -> None:
    environment = {name: value for name, value in os.environ.items() if name not in ("DVC_NO_ANALYTICS", "DVC_TEST")}
    result = subprocess.run(
        [sys.executable, "-c", "from dvc.analytics import is_enabled; print(is_enabled())"],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "False", result.stdout + result.stderr
