"""Load on the class server: concurrent students' stages against PostgreSQL, then the same against SQLite.

    python -m benchmarks.class_server_load [--clients 30] [--seconds 60] [--backends postgresql sqlite]

For each backend: a fresh class server (`python -m pipeline.server init --backend B`, accounts on, artifacts
proxied) on 127.0.0.1, one account and experiment per client, then `--clients` threads, each acting as one
student's stage over MLflow's REST API for `--seconds`: create a run, log 10 params, log a training curve in
batches (5 batches of 50 steps of `train/loss`, 0.2 s apart), upload a 4 KiB artifact, end the run FINISHED;
again until the time is up. Afterwards every run is read back. It prints, per backend: runs started, FINISHED and
failed, metric points sent against stored (lost = sent - stored), requests that failed, p50/p95/max request
latency, and the server's peak memory (the MLflow server's processes, plus PostgreSQL's). The clients run in this
process on the same machine: on 2 cores they compete with the server for the CPU, as a lab's laptops would not.

PostgreSQL refuses to run as root: run this as a normal account (the instructor's), with PostgreSQL installed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests

from pipeline.common.errors import PipelineError
from pipeline.server.command import ServerFolder

API = "/api/2.0/mlflow"
BATCHES, POINTS_PER_BATCH, BATCH_PAUSE_S = 5, 50, 0.2
ARTIFACT = os.urandom(4096)
REQUEST_TIMEOUT_S = 60.0


@dataclass
class ClientRecord:
    runs_started: list[str] = field(default_factory=list)
    runs_finished: int = 0
    points_sent: int = 0
    failures: int = 0
    latencies_s: list[float] = field(default_factory=list)


def _server(backend: str, folder: Path, port: int, admin: tuple[str, str], workers: int) -> None:
    """init + start a class server with `backend` and `workers` MLflow processes in `folder` (a subprocess each,
    as an instructor types them)."""
    environment = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": admin[1]}
    base = [sys.executable, "-m", "pipeline.server", "--dir", str(folder)]
    for command in (
        [
            *base,
            "init",
            "--backend",
            backend,
            "--port",
            str(port),
            "--pg-port",
            str(port + 1),
            "--admin",
            admin[0],
            "--workers",
            str(workers),
        ],
        [*base, "start"],
    ):
        done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PipelineError(f"{' '.join(command[3:6])} failed: {done.stderr.strip()}")


def _students(url: str, admin: tuple[str, str], count: int) -> list[tuple[tuple[str, str], str]]:
    """`count` accounts made by the admin, each with its own experiment (created as the student, who manages it)."""
    students = []
    for number in range(count):
        login = (f"student{number:02d}", secrets.token_urlsafe(12))
        created = requests.post(
            f"{url}{API}/users/create", json={"username": login[0], "password": login[1]}, auth=admin, timeout=60
        )
        created.raise_for_status()
        experiment = requests.post(
            f"{url}{API}/experiments/create", json={"name": f"load-{login[0]}"}, auth=login, timeout=60
        )
        experiment.raise_for_status()
        students.append((login, str(experiment.json()["experiment_id"])))
    return students


def _call(session: requests.Session, record: ClientRecord, method: str, url: str, **arguments: object) -> bool:
    started = time.perf_counter()
    try:
        response = session.request(method, url, timeout=REQUEST_TIMEOUT_S, **arguments)  # type: ignore[arg-type]
        ok = response.ok
    except requests.RequestException:
        ok = False
    record.latencies_s.append(time.perf_counter() - started)
    record.failures += not ok
    return ok


def _client(url: str, login: tuple[str, str], experiment_id: str, deadline: float, record: ClientRecord) -> None:
    """One student's stages, back to back, until `deadline`."""
    with requests.Session() as session:
        session.auth = login
        while time.monotonic() < deadline:
            created = session.post(
                f"{url}{API}/runs/create", json={"experiment_id": experiment_id, "run_name": "train"},
                timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            if not created.ok:
                record.failures += 1
                continue
            run_id = created.json()["run"]["info"]["run_id"]
            record.runs_started.append(run_id)
            params = [{"key": f"train.p{index}", "value": str(index)} for index in range(10)]
            _call(session, record, "POST", f"{url}{API}/runs/log-batch", json={"run_id": run_id, "params": params})
            for batch in range(BATCHES):
                now = int(time.time() * 1000)
                steps = range(batch * POINTS_PER_BATCH, (batch + 1) * POINTS_PER_BATCH)
                metrics = [{"key": "train/loss", "value": 1.0 / (1 + step), "timestamp": now, "step": step}
                           for step in steps]  # fmt: skip
                record.points_sent += len(metrics)
                _call(
                    session, record, "POST", f"{url}{API}/runs/log-batch", json={"run_id": run_id, "metrics": metrics}
                )
                time.sleep(BATCH_PAUSE_S)
            artifact = f"{url}/api/2.0/mlflow-artifacts/artifacts/{experiment_id}/{run_id}/artifacts/summary.txt"
            _call(session, record, "PUT", artifact, data=ARTIFACT)
            if _call(session, record, "POST", f"{url}{API}/runs/update", json={"run_id": run_id, "status": "FINISHED"}):
                record.runs_finished += 1


def _memory_mb(folder: ServerFolder, backend: str) -> float:
    """RSS of the MLflow server's process tree, plus the PostgreSQL postmaster's and its backends'."""
    roots = [int(folder.pid.read_text())]
    postmaster = folder.root / "postgres" / "postmaster.pid"
    if backend == "postgresql" and postmaster.exists():
        roots.append(int(postmaster.read_text().split()[0]))
    total = 0
    for root in roots:
        try:
            process = psutil.Process(root)
            for member in [process, *process.children(recursive=True)]:
                total += member.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


@dataclass(frozen=True)
class LoadResult:
    backend: str
    runs_started: int
    runs_finished: int
    runs_stored_finished: int
    points_sent: int
    points_stored: int
    failures: int
    requests: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    peak_memory_mb: float

    def row(self) -> str:
        lost = self.points_sent - self.points_stored
        return (
            f"| {self.backend} | {self.runs_started} | {self.runs_stored_finished} | "
            f"{self.runs_started - self.runs_stored_finished} | {self.points_sent} | {self.points_stored} | {lost} | "
            f"{self.failures} of {self.requests} | {self.p50_ms:.0f} | {self.p95_ms:.0f} | {self.max_ms:.0f} | "
            f"{self.peak_memory_mb:.0f} |"
        )


HEADER = (
    "| backend | runs started | runs FINISHED (stored) | runs not finished | metric points sent | stored | lost | "
    "failed requests | p50 ms | p95 ms | max ms | server peak MB |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def measure(backend: str, clients: int, seconds: float, scratch: Path, port: int, workers: int = 4) -> LoadResult:
    admin = ("admin", secrets.token_urlsafe(16))
    folder = ServerFolder(scratch / backend)
    _server(backend, folder.root, port, admin, workers)
    url = f"http://127.0.0.1:{port}"
    try:
        students = _students(url, admin, clients)
        records = [ClientRecord() for _ in students]
        deadline = time.monotonic() + seconds
        threads = [
            threading.Thread(target=_client, args=(url, login, experiment, deadline, record))
            for (login, experiment), record in zip(students, records, strict=True)
        ]
        for thread in threads:
            thread.start()
        peak = 0.0
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, _memory_mb(folder, backend))
            time.sleep(1.0)
        for thread in threads:
            thread.join()
        stored_points = stored_finished = 0
        with requests.Session() as session:
            session.auth = admin
            for record in records:
                for run_id in record.runs_started:
                    run = session.get(f"{url}{API}/runs/get", params={"run_id": run_id}, timeout=60).json()["run"]
                    stored_finished += run["info"]["status"] == "FINISHED"
                    query: dict[str, str | int] = {"run_id": run_id, "metric_key": "train/loss", "max_results": 25000}
                    history = session.get(f"{url}{API}/metrics/get-history", params=query, timeout=60).json()
                    stored_points += len(history.get("metrics", []))
        latencies = sorted(latency for record in records for latency in record.latencies_s) or [0.0]
        return LoadResult(
            backend=backend,
            runs_started=sum(len(record.runs_started) for record in records),
            runs_finished=sum(record.runs_finished for record in records),
            runs_stored_finished=stored_finished,
            points_sent=sum(record.points_sent for record in records),
            points_stored=stored_points,
            failures=sum(record.failures for record in records),
            requests=len(latencies),
            p50_ms=1000 * statistics.median(latencies),
            p95_ms=1000 * latencies[int(0.95 * (len(latencies) - 1))],
            max_ms=1000 * latencies[-1],
            peak_memory_mb=peak,
        )
    finally:
        subprocess.run([sys.executable, "-m", "pipeline.server", "--dir", str(folder.root), "stop"],
                       capture_output=True, check=False)  # fmt: skip


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=30, help="concurrent students (default 30)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long they work (default 60)")
    parser.add_argument("--backends", nargs="+", choices=("postgresql", "sqlite"), default=["postgresql", "sqlite"])
    parser.add_argument("--port", type=int, default=5077, help="first server's port (the next ones follow)")
    parser.add_argument("--workers", type=int, default=4, help="MLflow server processes (default 4, MLflow's)")
    options = parser.parse_args(arguments)
    results = []
    with tempfile.TemporaryDirectory(prefix="class-load-") as scratch:
        for index, backend in enumerate(options.backends):
            print(f"{backend}: {options.clients} clients for {options.seconds:.0f} s ...", flush=True)
            results.append(
                measure(
                    backend, options.clients, options.seconds, Path(scratch), options.port + 2 * index, options.workers
                )
            )
    print(
        f"\n{options.clients} clients, {options.seconds:.0f} s, {options.workers} MLflow server processes, "
        f"{psutil.cpu_count()} CPUs\n\n{HEADER}"
    )
    for result in results:
        print(result.row())


if __name__ == "__main__":
    main()
