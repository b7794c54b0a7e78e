"""The class's DVC remote over SSH with a real sshd (127.0.0.1, throwaway keys, a non-default port): clone A pushes,
clone B pulls and has nothing to rerun; a wrong key or a closed port fails with DVC's message and loses nothing."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.projects import clone_project, run_command, stage_environment
from tests.helpers.servers import closed_port
from tests.helpers.sshd import SshServer, running_sshd

pytestmark = pytest.mark.slow
GIT_IDENTITY = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
REMOTE = "class"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


def use_remote(project: Path, url: str, key: Path, environment: dict[str, str]) -> None:
    """What a student types: the remote's URL in the committed config, the key in the git-ignored local one."""
    for command in (
        ["dvc", "remote", "add", "--force", "--default", REMOTE, url],
        ["dvc", "remote", "modify", "--local", REMOTE, "keyfile", str(key)],
        ["dvc", "remote", "modify", REMOTE, "timeout", "20"],
    ):
        done = run_command(command, project, environment)
        assert done.returncode == 0, (command, done.stderr)


@pytest.fixture(scope="module")
def pushed_over_ssh(
    tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path, reproduced_project: Path, sshd: SshServer
) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ssh-sharing")
    first, storage = clone_project(reproduced_project, root / "first"), root / "storage"
    environment = stage_environment(mnist_mirror)
    use_remote(first, sshd.url(storage), sshd.key, environment)
    for command in (["git", "add", "-A"], ["git", *GIT_IDENTITY, "commit", "-qm", "run"], ["dvc", "push"]):
        done = run_command(command, first, environment)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    assert "Accepted publickey" in sshd.log.read_text()
    return first, storage


def test_a_second_machine_pulls_over_ssh_and_has_nothing_to_rerun(
    pushed_over_ssh: tuple[Path, Path], sshd: SshServer, tmp_path: Path, run_in: Any
) -> None:
    first, storage = pushed_over_ssh
    assert any(path.is_file() for path in storage.rglob("*")), "dvc push stored nothing"
    second = tmp_path / "second"
    subprocess.run(["git", "clone", "-q", str(first), str(second)], check=True)
    assert f"url = {sshd.url(storage)}" in (second / ".dvc" / "config").read_text()  # the remote came with git
    run_in(second, "dvc", "remote", "modify", "--local", REMOTE, "keyfile", str(sshd.key))
    pulled = run_in(second, "dvc", "pull", env={"MNIST_MIRROR": "/nonexistent"})
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    assert _md5(second / "models" / "model.pt") == _md5(first / "models" / "model.pt")
    assert json.loads(run_in(second, "dvc", "status", "--json").stdout) == {"validate": ["always changed"]}
    repro = run_in(second, "dvc", "repro", env={"MNIST_MIRROR": "/nonexistent"})
    assert repro.returncode == 0, repro.stderr[-2000:]
    assert set(re.findall(r"Running stage '([^']+)'", repro.stdout)) == {"validate"}  # same hardware: nothing else


@pytest.mark.parametrize("fault", ["wrong key", "closed port"])
def test_a_wrong_key_or_a_closed_port_fails_clearly_and_loses_nothing(
    pushed_over_ssh: tuple[Path, Path], sshd: SshServer, tmp_path: Path, run_in: Any, fault: str
) -> None:
    first, storage = pushed_over_ssh
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(first), str(clone)], check=True)
    if fault == "wrong key":
        run_in(clone, "dvc", "remote", "modify", "--local", REMOTE, "keyfile", str(sshd.stranger_key))
        expected = "Permission denied"
    else:
        run_in(clone, "dvc", "remote", "modify", "--local", REMOTE, "url", f"ssh://127.0.0.1:{closed_port()}{storage}")
        run_in(clone, "dvc", "remote", "modify", "--local", REMOTE, "keyfile", str(sshd.key))
        expected = "Connect call failed"
    tracked = subprocess.run(["git", "ls-files", "-s"], cwd=clone, capture_output=True, text=True).stdout
    stored = sorted((path, path.stat().st_size) for path in storage.rglob("*") if path.is_file())

    pulled = run_in(clone, "dvc", "pull", env={"MNIST_MIRROR": "/nonexistent"})
    assert pulled.returncode != 0 and "Traceback" not in pulled.stderr + pulled.stdout
    assert expected in pulled.stderr, pulled.stderr[-1500:]
    assert "ERROR" in pulled.stderr and len(pulled.stderr.strip().splitlines()) <= 12, pulled.stderr
    assert not (clone / "models" / "model.pt").exists()
    # Nothing lost: git's files as cloned, the remote as pushed, and A's push still fine from A.
    assert subprocess.run(["git", "ls-files", "-s"], cwd=clone, capture_output=True, text=True).stdout == tracked
    assert subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout == ""
    assert sorted((path, path.stat().st_size) for path in storage.rglob("*") if path.is_file()) == stored
    pushed = run_in(first, "dvc", "push")
    assert pushed.returncode == 0 and "Everything is up to date" in pushed.stdout + pushed.stderr
