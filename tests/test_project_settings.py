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
import yaml

from pipeline.params.parsing import RESTORE_HINT
from tests.helpers.repo import REPO_ROOT

PROBE = """
from tests.helpers.projects import reproduced_cache

def test_probe(request):
    found = reproduced_cache(request.config)
    print("CACHE", "none" if found is None else found.name)
"""


@pytest.mark.slow  # a pytest process of its own, which imports the suite (torch, MLflow): `make test` only
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


def _declared_outputs() -> dict[str, bool]:
    """Every output dvc.yaml declares (outs, metrics, plots; `${item}` expanded over the devices in params.yaml), and
    whether it is `persist` (DVC leaves it in place when its stage runs)."""
    pipeline = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    devices = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["profile"]["devices"]
    found: dict[str, bool] = {}
    for stage in pipeline["stages"].values():
        body = stage.get("do", stage)
        for kind in ("outs", "metrics", "plots"):
            for entry in body.get(kind, []):
                path, options = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
                for item in devices if "${item}" in path else [None]:
                    found[path.replace("${item}", str(item))] = bool((options or {}).get("persist"))
    return found


def test_dvc_removes_no_output_before_its_stage_so_the_restore_hint_of_params_errors_is_true() -> None:
    """Said with every params error: the last complete outputs are untouched. True only if DVC removes none."""
    outputs = _declared_outputs()
    assert len(outputs) > 20 and "report" in outputs and "models/model.pt" in outputs
    assert [path for path, persist in outputs.items() if not persist] == []
    assert RESTORE_HINT.startswith("The last complete outputs are untouched")
