"""Across machines: `dvc push` from one clone, `dvc pull` in another; two clones train identically."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.projects import clone_project, copy_project, run_command, stage_environment, use_tiny_params

pytestmark = pytest.mark.slow

GIT_IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@example.com"]


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path, reproduced_project: Path) -> tuple[Path, Path]:
    """Clone A: the whole pipeline run and committed, its outputs pushed to a local-folder remote."""
    root = tmp_path_factory.mktemp("sharing")
    first = clone_project(reproduced_project, root / "first")
    storage = root / "storage"
    environment = stage_environment(mnist_mirror)
    for command in (
        ["dvc", "remote", "modify", "local", "url", str(storage)],  # the project's default remote, moved to tmp
        ["git", "add", "-A"],
        ["git", *GIT_IDENTITY, "commit", "-qm", "pipeline run"],
        ["dvc", "push"],
    ):
        result = run_command(command, first, environment)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    return first, storage


def test_fresh_clone_pulls_everything_and_has_nothing_to_rerun(
    pushed: tuple[Path, Path], tmp_path: Path, run_in: Any
) -> None:
    first, storage = pushed
    assert any(storage.rglob("*")), "dvc push stored nothing"
    second = tmp_path / "second"
    subprocess.run(["git", "clone", "-q", str(first), str(second)], check=True)
    assert not (second / "models" / "model.pt").exists()  # outputs come from the remote, not git

    pulled = run_in(second, "dvc", "pull", env={"MNIST_MIRROR": "/nonexistent"})  # no data source but the remote
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert _md5(second / "models" / "model.pt") == _md5(first / "models" / "model.pt")
    assert _md5(second / "graph" / "model.onnx") == _md5(first / "graph" / "model.onnx")
    status = json.loads(run_in(second, "dvc", "status", "--json").stdout)
    # The params and machine check (which records the fingerprint) runs every time by design; nothing else reruns.
    assert status == {"validate": ["always changed"]}

    repro = run_in(second, "dvc", "repro", env={"MNIST_MIRROR": "/nonexistent"})
    assert repro.returncode == 0, repro.stderr[-2000:]
    # Same machine: nothing else; validate passes with the mirror gone, as the pulled data set is in place.
    assert set(re.findall(r"Running stage '([^']+)'", repro.stdout)) == {"validate"}


def test_two_clones_get_the_same_data_digest_and_checkpoint(
    pushed: tuple[Path, Path], tmp_path: Path, run_in: Any
) -> None:
    first, _ = pushed
    third = copy_project(tmp_path / "third")  # trains on its own, nothing pulled
    use_tiny_params(third)
    result = run_in(third, "dvc", "repro", "train")
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = "data/MNIST/manifest.json"
    assert (
        json.loads((third / manifest).read_text())["dataset_digest"]
        == json.loads((first / manifest).read_text())["dataset_digest"]
    )
    assert _md5(third / "models" / "model.pt") == _md5(first / "models" / "model.pt")
    assert (third / "metrics" / "train.json").read_bytes() == (first / "metrics" / "train.json").read_bytes()
