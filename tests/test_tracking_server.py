"""Remote tracking: a real `mlflow server` on 127.0.0.1, and servers that are down or failing."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from mlflow import MlflowClient

from pipeline.data.mnist import MNIST_SHA256, dataset_digest
from tests.helpers.repo import REPO_ROOT
from tests.helpers.servers import closed_port, running_mlflow_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` with its own SQLite store and artifact folder; ready once /health answers."""
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as uri:
        yield uri


def test_stage_logs_its_run_and_artifacts_to_the_server(mlflow_server: str, project_copy: Path, run_in: Any) -> None:
    result = run_in(project_copy, sys.executable, "-m", "stages.download", env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (project_copy / "mlflow.db").exists()  # nothing went to the local default store
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("mnist-lab")
    (run,) = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'download'")
    assert run.info.status == "FINISHED"
    assert run.data.tags["data.digest"] == dataset_digest(MNIST_SHA256)
    downloaded = client.download_artifacts(run.info.run_id, "samples_by_class.png", str(project_copy))
    assert Path(downloaded).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreachable_server_fails_fast_with_the_fix(project_copy: Path, run_in: Any) -> None:
    uri = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = run_in(project_copy, sys.executable, "-m", "stages.download", env={"MLFLOW_TRACKING_URI": uri})
    assert time.monotonic() - started < 30
    assert result.returncode == 2
    assert f"MLflow tracking server {uri} is unreachable" in result.stderr and "Nothing was run" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (project_copy / "data" / "MNIST").exists()


class _Failing(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(503)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Counting503(_Failing):
    """Answers every request HTTP 503 and counts them in its server's `requests`."""

    def do_GET(self) -> None:
        self.server.requests += 1  # type: ignore[attr-defined]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PATCH = do_DELETE = do_GET


def test_failing_server_is_reported_not_retried_for_minutes(project_copy: Path, run_in: Any) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        started = time.monotonic()
        result = run_in(project_copy, sys.executable, "-m", "stages.download", env={"MLFLOW_TRACKING_URI": uri})
        assert time.monotonic() - started < 30
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2
    assert f"MLflow tracking server {uri} answered HTTP 503 on /health" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- credentials, a server that dies or stalls

PROBE = """
import sys
from pipeline.common.stage_runner import run_stage
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.lifecycle import open_tracker

def main() -> None:
    config = TrackingConfig(experiment="server-faults", tensorboard_dir="runs", registered_model="lab-model")
    with open_tracker("probe", config) as tracker:
        tracker.log_metrics({"x": 1.0})
        print(tracker.run_id, flush=True)
        sys.stdin.readline()  # the test breaks the connection to the server here
        tracker.log_metrics({"x": 2.0})

run_stage("probe", main)
"""


class _Proxy:
    """A TCP relay in front of the real server that can stop answering: `down()` refuses and drops every
    connection (a dead server), `stall()` accepts and never answers (a hung one), `failing()` drops every
    connection and relays new ones to a server that answers each request HTTP 503 and counts them (a reverse proxy
    whose backend died)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.failing_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting503)
        self.failing_server.requests = 0  # type: ignore[attr-defined]
        threading.Thread(target=self.failing_server.serve_forever, daemon=True).start()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.uri = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.mode = "forward"
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed by down()
            self.sockets.append(client)
            if self.mode in ("forward", "failing"):
                target = self.upstream if self.mode == "forward" else self.failing_server.server_address[:2]
                server = socket.create_connection(target)
                self.sockets.append(server)
                for source, target in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        # A relay forwards only while the mode it started in holds, checked after each recv: one idle in recv when
        # `stall()` came must not forward the next request (it did, so a stage's next call could still succeed and
        # the stall go unnoticed).
        try:
            mode = self.mode
            while (data := source.recv(65536)) and self.mode == mode:
                target.sendall(data)
        except OSError:
            pass

    def down(self) -> None:
        self.mode = "down"
        self.listener.close()
        self._drop_connections()

    def failing(self) -> None:
        self.mode = "failing"
        self._drop_connections()

    @property
    def failed_requests(self) -> int:
        return self.failing_server.requests  # type: ignore[attr-defined,no-any-return]

    def _drop_connections(self) -> None:
        for connection in self.sockets:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
                connection.close()

    def stall(self) -> None:
        self.mode = "stall"  # existing relays stop forwarding; new connections are accepted and ignored


RUN_ID = re.compile(r"[0-9a-f]{32}")


def _run_id_line(stdout: IO[str]) -> str:
    """The probe's run id: the first stdout line that is one (MLflow prints "View run" lines too)."""
    for line in stdout:
        if RUN_ID.fullmatch(line.strip()):
            return line.strip()
    pytest.fail("the probe ended before its run started")


def _probe(uri: str, cwd: Path, retries: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """PROBE against `uri`; a 3 s HTTP timeout and no retry (unless `retries` says otherwise), so a stalled server
    fails it in seconds."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    environment.update(
        {
            "MLFLOW_TRACKING_URI": uri,
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "3",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
            "PYTHONPATH": str(REPO_ROOT),
            **(retries or {}),
        }
    )
    pipe = subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, "-c", PROBE], cwd=cwd, env=environment, text=True, stdin=pipe, stdout=pipe, stderr=pipe
    )


@pytest.mark.parametrize("fault", ["down", "stall"])
def test_server_failing_mid_stage_is_reported_and_its_run_marked_failed_later(
    mlflow_server: str, tmp_path: Path, fault: str
) -> None:
    proxy = _Proxy(mlflow_server)
    process = _probe(proxy.uri, tmp_path)
    assert process.stdout is not None
    run_id = _run_id_line(process.stdout)  # the stage is now inside its run
    getattr(proxy, fault)()
    _, stderr = process.communicate("\n", timeout=120)
    if fault == "stall":
        proxy.down()
    assert process.returncode == 2, stderr[-3000:]
    assert f"MLflow tracking store {proxy.uri} failed during the stage" in stderr
    assert "No outputs were written" in stderr
    assert f"Its MLflow run {run_id} could not be ended" in stderr
    assert "marks it FAILED" in stderr
    assert "Traceback" not in stderr
    client = MlflowClient(mlflow_server)
    assert client.get_run(run_id).info.status == "RUNNING"  # the store was unreachable at the end

    again = _probe(mlflow_server, tmp_path)  # the next stage, with the server reachable again
    _, stderr = again.communicate("\n", timeout=120)
    assert again.returncode == 0, stderr[-3000:]
    assert client.get_run(run_id).info.status == "FAILED"
    assert "ended without closing the run" in client.get_run(run_id).data.tags["pipeline.ended_by"]


def test_a_store_that_spent_its_retries_is_tried_once_per_cleanup_call(mlflow_server: str, tmp_path: Path) -> None:
    """With 3 retries a call to a failing server makes 4 requests. The stage's last flush spends that budget once;
    its cleanup (flush what is left, end the run and the parent) then gets one try per call (lifecycle.ONE_TRY).
    Without that, each cleanup call spent the budget again: with the defaults, a minute each, so a student waited
    three minutes for the message (seen in the class-server stress test). Counted in requests, not seconds: a
    timed bound failed under the load of a parallel suite."""
    proxy = _Proxy(mlflow_server)
    budget = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",  # no sleeps: the test counts requests
        "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0",
    }
    process = _probe(proxy.uri, tmp_path, retries=budget)
    assert process.stdout is not None
    run_id = _run_id_line(process.stdout)
    proxy.failing()
    _, stderr = process.communicate("\n", timeout=120)
    assert process.returncode == 2 and f"Its MLflow run {run_id} could not be ended" in stderr, stderr[-3000:]
    assert "503" in stderr, stderr[-3000:]
    # The budget once (4 requests), then one try per cleanup call that reaches the store (ending the run: 5 in
    # all); a cleanup call that spent the budget again would make it 8 or more.
    assert 4 < proxy.failed_requests < 2 * 4, proxy.failed_requests


def test_password_in_tracking_uri_is_sent_as_basic_auth_and_never_shown(mlflow_server: str, tmp_path: Path) -> None:
    uri = mlflow_server.replace("http://", "http://alice:hunter2@")
    process = _probe(uri, tmp_path)
    stdout, stderr = process.communicate("\n", timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    assert "hunter2" not in stdout + stderr
    (run_id,) = [line for line in stdout.splitlines() if RUN_ID.fullmatch(line)]  # among MLflow's "View run" lines
    run = MlflowClient(mlflow_server).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert "hunter2" not in json.dumps([run.data.params, run.data.tags, run.info.artifact_uri])
