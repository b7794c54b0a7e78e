"""The class server (`python -m pipeline.server`) run for real: PostgreSQL, `mlflow server --app-name basic-auth`.

PostgreSQL refuses to run as root. Where the tests run as root (CI), the server runs under an unprivileged
account, created here if it is missing, as an instructor's normal account would; elsewhere as the current user.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.repo import REPO_ROOT
from tests.helpers.servers import closed_port

SERVER_ACCOUNT = "mnistlab"
INSTALL = "apt-get install -y postgresql (Debian/Ubuntu: PostgreSQL's initdb and pg_ctl)"
# Made per test session, so a search for them cannot hit this source file (copied with the project).
ADMIN = ("admin", f"admin-{secrets.token_urlsafe(12)}")
STUDENTS = {name: f"{name}-{secrets.token_urlsafe(12)}" for name in ("alice", "bob")}
COMMAND_LIMIT_S = 180
# Two MLflow server processes, not MLflow's four: still more than one (a login cached by one worker and not the
# other is part of what the tests check), at half the start-up cost on two cores.
WORKERS = 2


def postgres_missing() -> str | None:
    """Why the class server cannot run here, or None. Tests fail with this (never skip): CI must install it."""
    found = shutil.which("initdb") or any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return None if found else f"PostgreSQL's server programs are not installed; run `{INSTALL}`."


def _account() -> dict[str, Any]:
    """subprocess keyword arguments that run a command as the server's account (none unless root)."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", SERVER_ACCOUNT], check=True)
    # The account runs this venv's python and reads the repository: every folder above them must let it pass.
    for path in (Path(sys.executable).resolve(), Path(sys.executable).absolute(), REPO_ROOT / "pipeline"):
        for folder in path.parents:
            mode = folder.stat().st_mode
            if not mode & stat.S_IXOTH:
                os.chmod(folder, mode | stat.S_IXOTH)
    return {"user": SERVER_ACCOUNT, "group": SERVER_ACCOUNT, "extra_groups": []}


@dataclass
class ClassServer:
    folder: Path
    url: str
    account: dict[str, Any] = field(default_factory=dict)

    def command(self, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`python -m pipeline.server --dir FOLDER ARGUMENTS` as the instructor's account, from the project root."""
        environment = {key: value for key, value in os.environ.items() if not key.startswith(("MLFLOW_", "LAB_"))}
        if self.account:
            environment["HOME"] = str(self.folder.parent)
        environment.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "pipeline.server", "--dir", str(self.folder), *arguments],
            cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=COMMAND_LIMIT_S, check=False,
            stdin=subprocess.DEVNULL, **self.account,
        )  # fmt: skip


def scratch_folder(account: dict[str, Any]) -> Path:
    """A folder the server's account owns (pytest's own tmp folders are private to root)."""
    scratch = Path(tempfile.mkdtemp(prefix="class-server-", dir="/tmp"))
    if account:
        shutil.chown(scratch, account["user"], account["group"])
    return scratch


@contextmanager
def running_class_server() -> Iterator[ClassServer]:
    """init (admin password from MLflow's variable), start, add alice and bob; stop and remove at the end."""
    missing = postgres_missing()
    assert missing is None, missing
    account = _account()
    scratch = scratch_folder(account)
    port, pg_port = closed_port(), closed_port()  # free: nothing listens there yet
    server = ClassServer(scratch / "server", f"http://127.0.0.1:{port}", account)
    try:
        init = server.command(
            "init", "--port", str(port), "--pg-port", str(pg_port), "--admin", ADMIN[0], "--workers", str(WORKERS),
            env={"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1]},
        )  # fmt: skip
        assert init.returncode == 0, init.stderr + init.stdout
        started = server.command("start")
        assert started.returncode == 0, started.stderr + started.stdout
        for name, password in STUDENTS.items():
            added = server.command("add-student", name, env={"LAB_STUDENT_PASSWORD": password})
            assert added.returncode == 0, added.stderr + added.stdout
            assert "Warning" not in added.stderr, added.stderr  # the instructor's terminal shows no library noise
        yield server
    finally:
        server.command("stop")
        shutil.rmtree(scratch, ignore_errors=True)
