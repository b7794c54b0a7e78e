"""A PostgreSQL cluster in the class server's folder: initdb, pg_ctl and createdb, never the system cluster.

The server listens on no TCP port at all: only on a Unix socket inside the folder (mode 0700), with `peer`
authentication, so only the instructor's own account reaches the database and no database password exists to
leak. MLflow connects through that socket (`postgresql+psycopg2://USER@/DB?host=SOCKET_DIR&port=PORT`).
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import PipelineError

INSTALL_HINT = (
    "Install PostgreSQL's server programs (Debian/Ubuntu: `sudo apt-get install postgresql`; they land in "
    "/usr/lib/postgresql/<version>/bin, which is searched too), then run the command again."
)
COMMAND_LIMIT_S = 120


@dataclass(frozen=True)
class Cluster:
    data: Path  # the cluster's data directory (initdb)
    socket: Path  # the Unix socket's directory
    log: Path
    port: int  # names the socket file (.s.PGSQL.<port>); nothing listens on TCP
    user: str  # the database role: the OS account that runs the server (peer authentication)

    def uri(self, database: str) -> str:
        return f"postgresql+psycopg2://{self.user}@/{database}?host={self.socket}&port={self.port}"

    def _program(self, name: str) -> str:
        found = shutil.which(name)
        if found:
            return found
        for version in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (version / name).is_file():
                return str(version / name)
        raise PipelineError(f"PostgreSQL's `{name}` was not found on PATH. {INSTALL_HINT}")

    def _run(self, name: str, *arguments: str) -> str:
        command = [self._program(name), *arguments]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_LIMIT_S, check=False)
        except subprocess.TimeoutExpired as error:
            raise PipelineError(f"`{name}` did not finish within {COMMAND_LIMIT_S} s; see {self.log}.") from error
        if done.returncode != 0:
            output = " ".join((done.stderr or done.stdout).split())[-600:]
            raise PipelineError(f"`{name}` failed (exit {done.returncode}): {output} The log is {self.log}.")
        return done.stdout

    def create(self) -> None:
        """A new cluster in `data`: UTF-8, the current account as superuser, peer login on the socket only."""
        require_not_root()
        self._run(
            "initdb",
            "--pgdata", str(self.data),
            "--username", self.user,
            "--encoding", "UTF8",
            "--auth-local", "peer",
            "--auth-host", "reject",
            "--no-instructions",
        )  # fmt: skip

    def running(self) -> bool:
        status = subprocess.run(
            [self._program("pg_ctl"), "status", "--pgdata", str(self.data)], capture_output=True, check=False
        )
        return status.returncode == 0

    def start(self) -> None:
        require_not_root()
        if self.running():
            return
        self.socket.mkdir(mode=0o700, exist_ok=True)
        options = f"-c listen_addresses='' -k {self.socket} -p {self.port}"
        self._run("pg_ctl", "start", "--pgdata", str(self.data), "--log", str(self.log), "--wait", "-o", options)

    def stop(self) -> None:
        if self.running():
            self._run("pg_ctl", "stop", "--pgdata", str(self.data), "--mode", "fast", "--wait")

    def create_database(self, name: str) -> None:
        self._run("createdb", "--host", str(self.socket), "--port", str(self.port), "--username", self.user, name)


def require_not_root() -> None:
    if os.geteuid() == 0:
        raise PipelineError(
            "PostgreSQL refuses to run as root, so the class server does too. Run `python -m pipeline.server` "
            "as the instructor's normal account (for example `sudo -u alice python -m pipeline.server ...`), "
            "with a folder that account owns."
        )


def current_user() -> str:
    return getpass.getuser()
