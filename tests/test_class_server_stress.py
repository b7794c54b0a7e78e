"""A student's training against the class server while the server fails, all real: the MLflow
server SIGKILLed and started again, SIGSTOPped for 10 s and for 30 s (past three of the 8 s request timeouts),
PostgreSQL restarted, and the server gone for good. A short outage is ridden out with every metric kept; a long one
stops the stage with the message, no outputs, and the next stage marks the run it left FAILED. Then two students'
machines, compared by the instructor's machines report read from the server. Minutes of waiting: `make test-stress`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from pipeline.common.stage_runner import EXIT_USER_ERROR
from tests.helpers.class_server import ADMIN, STUDENTS, ClassServer, running_class_server
from tests.helpers.projects import (
    copy_project,
    copy_without_outputs,
    read_params,
    run_command,
    stage_environment,
    tiny_params,
    use_tiny_params,
    write_params,
)

pytestmark = [pytest.mark.slow, pytest.mark.stress]
API = "/api/2.0/mlflow"
EXPERIMENT = "mnist-lab-alice"
STAGE_LIMIT_S = 420


@pytest.fixture(scope="module")
def server() -> Iterator[ClassServer]:
    with running_class_server() as running:
        yield running


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """A tiny-params project with MNIST in place (its own store): each test copies it and trains."""
    project = copy_project(tmp_path_factory.mktemp("faults") / "project")
    use_tiny_params(project)
    done = run_command(["dvc", "repro", "download"], project, stage_environment(mnist_mirror))
    assert done.returncode == 0, done.stderr[-2000:]
    return project


def student_environment(server: ClassServer, mnist_mirror: Path) -> dict[str, str]:
    return stage_environment(
        mnist_mirror,
        {
            "MLFLOW_TRACKING_URI": server.url,
            "MLFLOW_TRACKING_USERNAME": "alice",
            "MLFLOW_TRACKING_PASSWORD": STUDENTS["alice"],
            "MLFLOW_EXPERIMENT_NAME": EXPERIMENT,
            "LAB_REGISTERED_MODEL": "mnist-labnet-alice",
        },
    )


def admin_get(server: ClassServer, path: str, **query: Any) -> Any:
    return requests.get(f"{server.url}{API}/{path}", params=query, auth=ADMIN, timeout=30).json()


def train_runs(server: ClassServer) -> list[dict[str, Any]]:
    experiment = admin_get(server, "experiments/get-by-name", experiment_name=EXPERIMENT)["experiment"]
    body = {"experiment_ids": [experiment["experiment_id"]], "filter": "attributes.run_name = 'train'"}
    found = requests.post(f"{server.url}{API}/runs/search", json=body, auth=ADMIN, timeout=30).json()
    return list(found.get("runs", []))


def start_training(project: Path, environment: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stages.train"], cwd=project, env=environment, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip


def wait_for_new_run(server: ClassServer, before: set[str], process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-2000:]
        new = [run for run in train_runs(server) if run["info"]["run_id"] not in before]
        if new and new[0]["info"]["status"] == "RUNNING":
            return str(new[0]["info"]["run_id"])
        time.sleep(0.2)
    pytest.fail("the training stage's run never appeared on the server")


def server_group(server: ClassServer) -> int:
    return int((server.folder / "mlflow.pid").read_text())


def signal_server(server: ClassServer, signum: int) -> None:
    """`signum` to the server's process group (uvicorn and its workers), as `kill -s SIG -PID` would."""
    os.killpg(server_group(server), signum)


def restart_postgres(server: ClassServer) -> None:
    script = (
        "import pathlib, sys; from pipeline.server.command import ServerFolder; "
        "folder = ServerFolder(pathlib.Path(sys.argv[1])); cluster = folder.cluster(folder.settings()); "
        "cluster.stop(); cluster.start()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(server.folder)], cwd=Path(__file__).parents[1], capture_output=True,
        text=True, timeout=120, check=False, **server.account,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def fault(server: ClassServer, kind: str) -> None:
    if kind == "server killed and restarted":
        signal_server(server, signal.SIGKILL)
        (server.folder / "mlflow.pid").unlink()
        started = server.command("start")
        assert started.returncode == 0, started.stderr
    elif kind.startswith("server stopped"):
        signal_server(server, signal.SIGSTOP)
        time.sleep(int(kind.split()[-1].rstrip("s")))
        signal_server(server, signal.SIGCONT)
    elif kind == "postgresql restarted":
        restart_postgres(server)


@pytest.mark.parametrize(
    "kind", ["server killed and restarted", "server stopped 10s", "server stopped 30s", "postgresql restarted"]
)
def test_a_short_outage_is_ridden_out_and_no_metric_is_lost(
    server: ClassServer, downloaded: Path, tmp_path: Path, mnist_mirror: Path, kind: str
) -> None:
    project = tmp_path / "project"
    shutil.copytree(downloaded, project, symlinks=True)
    before = {run["info"]["run_id"] for run in train_runs(server)}
    training = start_training(project, student_environment(server, mnist_mirror))
    run_id = wait_for_new_run(server, before, training)
    started = time.monotonic()
    fault(server, kind)
    stdout, stderr = training.communicate(timeout=STAGE_LIMIT_S)
    assert training.returncode == 0, (kind, time.monotonic() - started, stderr[-3000:])
    run = admin_get(server, "runs/get", run_id=run_id)["run"]
    assert run["info"]["status"] == "FINISHED"
    # Every step the stage logged is in the store: the curve of plots/train_steps.csv, point for point.
    written = (project / "plots" / "train_steps.csv").read_text().splitlines()[1:]
    steps = {int(float(line.split(",")[0])) for line in written}
    history = admin_get(server, "metrics/get-history", run_id=run_id, metric_key="train/loss", max_results=25000)
    assert {point["step"] for point in history["metrics"]} == steps, kind
    assert (project / "models" / "model.pt").is_file() and "registered in MLflow" in stdout


def test_a_long_outage_stops_the_stage_cleanly_and_the_next_run_succeeds(
    server: ClassServer, downloaded: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    project = tmp_path / "project"
    shutil.copytree(downloaded, project, symlinks=True)
    environment = student_environment(server, mnist_mirror)
    before = {run["info"]["run_id"] for run in train_runs(server)}
    training = start_training(project, environment)
    run_id = wait_for_new_run(server, before, training)
    signal_server(server, signal.SIGKILL)  # and not started again until the stage gave up
    (server.folder / "mlflow.pid").unlink()
    started = time.monotonic()
    _, stderr = training.communicate(timeout=STAGE_LIMIT_S)
    gave_up_s = time.monotonic() - started
    assert training.returncode == EXIT_USER_ERROR, stderr[-3000:]
    assert f"MLflow tracking store {server.url} failed during the stage" in stderr and "Traceback" not in stderr
    assert "No outputs were written" in stderr and not (project / "models" / "model.pt").exists()
    # Rode out the default retries once (sleeps of 62 s, test_contracts.py), then stopped: the cleanup's calls got
    # one try each (lifecycle.ONE_TRY); before that it waited the budget again per call, three minutes in all.
    assert 60 < gave_up_s < 100, gave_up_s
    assert server.command("start").returncode == 0
    again = run_command([sys.executable, "-m", "stages.train"], project, environment, STAGE_LIMIT_S)
    assert again.returncode == 0, again.stderr[-3000:]
    left = admin_get(server, "runs/get", run_id=run_id)["run"]["info"]["status"]
    assert left == "FAILED"  # marked by the next stage on this machine: no run stays RUNNING for ever


def test_two_students_machines_are_compared_in_one_report_from_the_server(
    server: ClassServer, tmp_path: Path, mnist_mirror: Path
) -> None:
    """Two clones with different LAB_MACHINE_LABEL profile (tiny params) as alice and bob into their own
    experiments on the PostgreSQL server; the instructor's `python -m pipeline.machines` reads both."""
    machines = {"alice": "lab-pc-01", "bob": "lab-pc-02"}
    for name, label in machines.items():
        project = copy_without_outputs(tmp_path / name)
        params = tiny_params(read_params(project))
        params["profile"].update(batch_sizes=[1], modes=["inference"])
        params["train"].update(train_samples=640, test_samples=500)
        write_params(project, params)
        environment = stage_environment(
            mnist_mirror,
            {
                "MLFLOW_TRACKING_URI": server.url,
                "MLFLOW_TRACKING_USERNAME": name,
                "MLFLOW_TRACKING_PASSWORD": STUDENTS[name],
                "MLFLOW_EXPERIMENT_NAME": f"mnist-lab-{name}",
                "LAB_REGISTERED_MODEL": f"mnist-labnet-{name}",
                "LAB_MACHINE_LABEL": label,
            },
        )
        done = run_command(["dvc", "repro", "profile"], project, environment, STAGE_LIMIT_S)
        assert done.returncode == 0, (name, done.stderr[-3000:])
    instructor = stage_environment(
        mnist_mirror,
        {"MLFLOW_TRACKING_URI": server.url, "MLFLOW_TRACKING_USERNAME": ADMIN[0], "MLFLOW_TRACKING_PASSWORD": ADMIN[1]},
    )
    output = tmp_path / "machines"
    command = [sys.executable, "-m", "pipeline.machines", "--experiment", "mnist-lab-*", "--output", str(output)]
    report = run_command(command, tmp_path / "alice", instructor)
    assert report.returncode == 0, report.stderr[-3000:]
    assert report.stdout.startswith("2 machine(s)"), report.stdout
    markdown = (output / "machines.md").read_text()
    assert all(label in markdown for label in machines.values()), markdown[:3000]
    student = dict(instructor, MLFLOW_TRACKING_USERNAME="bob", MLFLOW_TRACKING_PASSWORD=STUDENTS["bob"])
    alone = run_command([*command[:-1], str(tmp_path / "bob-view")], tmp_path / "bob", student)
    assert alone.returncode == 0 and alone.stdout.startswith("1 machine(s)"), alone.stdout + alone.stderr[-2000:]


def test_a_full_artifact_folder_stops_the_stage_with_the_reason_and_writes_nothing(
    server: ClassServer, downloaded: Path, tmp_path: Path, mnist_mirror: Path
) -> None:
    """The server's artifact folder on a 256 KiB tmpfs: the model (~5 MB) does not fit. The stage must stop with
    a message that says the server could not store it (the client sees only HTTP 500 or the connection closed
    mid-upload; the server's log has the reason), write no output, and leave no run RUNNING."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs over the server's artifact folder (CI runs as root)")
    artifacts = server.folder / "artifacts"
    owner = f"uid={artifacts.stat().st_uid},gid={artifacts.stat().st_gid},mode=0700"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=256k,{owner}", "tmpfs", str(artifacts)], check=True)
    try:
        project = tmp_path / "project"
        shutil.copytree(downloaded, project, symlinks=True)
        # The upload fails on every try (HTTP 500, or the connection closed), so the default budget would only add
        # a minute of waiting (the long outage test waits it out): one retry here.
        retry_once = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
        environment = student_environment(server, mnist_mirror) | retry_once
        before = {run["info"]["run_id"] for run in train_runs(server)}
        outputs = ["models/model.pt", "metrics/train.json", "metrics/train_speed.json", "plots/train_steps.csv"]
        before_bytes = {name: (project / name).read_bytes() if (project / name).exists() else None for name in outputs}
        done = run_command([sys.executable, "-m", "stages.train"], project, environment, STAGE_LIMIT_S)
        assert done.returncode == EXIT_USER_ERROR, done.stderr[-3000:]
        assert "Traceback" not in done.stderr and "No outputs were written" in done.stderr
        assert "The server failed to store an artifact" in done.stderr and "full or not writable" in done.stderr
        assert "No space left on device" in (server.folder / "mlflow.log").read_text()  # the reason, server-side
        after = {name: (project / name).read_bytes() if (project / name).exists() else None for name in outputs}
        assert after == before_bytes  # untouched
        left = [run["info"]["status"] for run in train_runs(server) if run["info"]["run_id"] not in before]
        assert left == ["FAILED"], left
    finally:
        subprocess.run(["umount", str(artifacts)], check=True)
