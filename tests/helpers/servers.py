"""Real servers for the tests, on 127.0.0.1: an `mlflow server`, `tensorboard`, and a port nothing listens on."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

from pipeline.common.browser import closed_port
from tests.helpers.repo import VENV_BIN


def _listens(leader: int, port: int) -> bool:
    """Whether a process of `leader`'s tree listens on `port`: the /health that answered is this server's, not
    that of a server another xdist worker started on the same (briefly closed) port."""
    try:
        tree = [psutil.Process(leader), *psutil.Process(leader).children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in tree:
        with suppress(psutil.Error):
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp")):
                return True
    return False


SERVER_START_LIMIT_S = 120  # measured 20-30 s on two cores; generous for a loaded CI machine
STOP_GRACE_S = 3


@contextmanager
def _serving(
    name: str, command: list[str], port: int, ready_path: str, environment: dict[str, str] | None = None
) -> Iterator[str]:
    """`command` started in a session of its own (so that the stop reaches every process it starts); yields
    `http://127.0.0.1:<port>` once `ready_path` answers 200 with a body other than `[]` and the server's own
    process tree listens on `port`; stops the whole session afterwards."""
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_LIMIT_S
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}{ready_path}", timeout=2) as response:
                    if response.status == 200 and response.read() != b"[]" and _listens(server.pid, port):
                        break
            except OSError:
                pass  # not listening yet
            assert server.poll() is None, f"{name} exited during start-up"
            assert time.monotonic() < deadline, f"{name} did not answer {ready_path} within {SERVER_START_LIMIT_S} s"
            time.sleep(0.5)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        # A server that still serves a connection the test left open (a stalled proxy's) waits out its graceful
        # shutdown: the test is over, so it gets a few seconds, then the whole session is killed.
        with suppress(subprocess.TimeoutExpired):
            server.wait(timeout=STOP_GRACE_S)
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # a worker that outlived the CLI
        server.wait(timeout=30)


@contextmanager
def running_mlflow_server(folder: Path, backend_store_uri: str | None = None) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1 (its SQLite store and artifacts in `folder` unless given);
    yields its URI once /health answers, stops it afterwards."""
    port = closed_port()
    store = backend_store_uri or f"sqlite:///{folder / 'server.db'}"
    command = [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", store]
    command += ["--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    # MLflow 3's job runner (eight more Python processes, for GenAI jobs) is switched off: the tests use none of
    # it, and on two cores it doubled the server's start-up.
    environment = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with _serving("mlflow server", [*command, "--workers", "1"], port, "/health", environment) as uri:
        yield uri


@contextmanager
def running_tensorboard(logdir: Path) -> Iterator[str]:
    """A real `tensorboard --logdir logdir` on 127.0.0.1, as the README tells users to start it; yields its URL once
    it lists the log directory's runs, stops it afterwards."""
    port = closed_port()
    command = [str(VENV_BIN / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--load_fast", "false", "--reload_interval", "1"]
    with _serving("tensorboard", command, port, "/data/runs") as url:
        yield url
