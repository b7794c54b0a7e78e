"""Remote tracking: a real `mlflow server` on 127.0.0.1, and servers that are down or failing."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from pipeline.data import MNIST_SHA256, dataset_digest
from tests.helpers import closed_port, running_mlflow_server

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
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.send_response(503)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


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
