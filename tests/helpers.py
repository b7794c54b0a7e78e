"""Shared test helpers (plain functions and constants; the fixtures live in conftest.py)."""

from __future__ import annotations

import copy
import gzip
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pipeline.data.idx import encode_idx
from pipeline.params.schema import ModelConfig
from pipeline.profiling.record import (
    PROFILE_PRECISION,
    Combination,
    OperatorRow,
    ProfileRecord,
    ProfileSettings,
    StepAnalysis,
    Timing,
    flop_rate,
)
from pipeline.profiling.statistics import GOVERNOR_NOT_EXPOSED, MeasurementConditions
from pipeline.profiling.trace_analysis import StepAnatomy

REPO_ROOT = Path(__file__).resolve().parents[1]
LAB_MODEL = ModelConfig(conv1_channels=32, conv2_channels=64, hidden_units=128, conv_dropout=0.25, hidden_dropout=0.5)
VENV_BIN = Path(sys.executable).parent


REPO_PARAMS: dict[str, Any] = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())  # never modify: copy


def make_synthetic_mnist(folder: Path, train: int = 40, test: int = 20, gz: bool = True) -> dict[str, str]:
    """Write four tiny IDX files shaped like MNIST's; return their SHA-256 digests (decompressed)."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    digests = {}
    for prefix, count in (("train", train), ("t10k", test)):
        labels = (np.arange(count) % 10).astype(np.uint8)
        images = generator.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            content = encode_idx(array)
            digests[name] = hashlib.sha256(content).hexdigest()
            target = folder / (name + ".gz" if gz else name)
            target.write_bytes(gzip.compress(content, mtime=0) if gz else content)
    return digests


def copy_project(target: Path) -> Path:
    """The project's tracked and new files copied into a fresh git repo (no .venv, stores or data).

    Like a fresh clone: dvc.lock and code, but no data, caches or tracking stores.
    """
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for relative in listed:
        source = REPO_ROOT / relative
        if source.is_file():
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    subprocess.run(["git", "init", "-q"], cwd=target, check=True)
    subprocess.run(["git", "add", "-A"], cwd=target, check=True)
    subprocess.run(
        ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-qm", "copy"],
        cwd=target,
        check=True,
    )
    return target


def stage_environment(mnist_mirror: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a user's shell has: venv first on PATH, the offline mirror, no MLflow overrides."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MLFLOW_")}
    environment.update({"PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "MNIST_MIRROR": str(mnist_mirror)})
    environment.update(extra or {})
    return environment


# No single command of the suite comes near this; it turns a hang into a failure with the output so far.
COMMAND_LIMIT_S = 900


def run_command(
    command: list[str], cwd: Path, env: dict[str, str] | None = None, limit_s: float = COMMAND_LIMIT_S
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(capture_output=True)` that cannot hang the suite.

    Output goes to temporary files, not pipes: `dvc queue start` forks daemons that keep the
    inherited stdout open for as long as they live, and a pipe reader would wait on them. A command
    past `limit_s` has its whole process group killed and fails the test with what it printed.
    """
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            returncode = process.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
        outputs = []
        for handle in (stdout, stderr):
            handle.seek(0)
            outputs.append(handle.read().decode(errors="replace"))
    if returncode is None:
        pytest.fail(
            f"{' '.join(command)} still running after {limit_s:.0f} s; killed.\n"
            f"stdout: {outputs[0][-2000:]}\nstderr: {outputs[1][-2000:]}"
        )
    return subprocess.CompletedProcess(command, returncode, outputs[0], outputs[1])


def read_params(project: Path) -> dict[str, Any]:
    return yaml.safe_load((project / "params.yaml").read_text())


def write_params(project: Path, params: dict[str, Any]) -> None:
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


# Outputs that are committed to git (cache: false) and so present in every copy: removed before a
# stage test, so a stale file can never pass for one the stage wrote.
TRACKED_OUTPUTS = (
    "metrics/train.json",
    "metrics/train_speed.json",
    "plots/train_steps.csv",
    "plots/train_epochs.csv",
    "plots/profile_comparison.csv",
    "metrics/graph.json",
    "graph/model_graph.svg",
    "graph/summary.md",
    "hardware/fingerprint.json",
    "profiles",
    "report",
)


def tiny_params(params: dict[str, Any]) -> dict[str, Any]:
    """The one small configuration every test uses (modified in place and returned).

    Training: one epoch over 6,400 images (100 steps), seconds yet well past chance.
    Profiling: 3 warm-up steps, 1 s of timing and 8 traced steps per combination."""
    params["train"].update(epochs=1, train_samples=6400, log_every_steps=20)
    params["profile"].update(warmup_steps=3, active_steps=8, time_budget_s=1.0)
    return params


def copy_without_outputs(target: Path) -> Path:
    """A fresh project copy without the committed outputs, so no stale file can pass for a new one."""
    project = copy_project(target)
    for relative in TRACKED_OUTPUTS:
        path = project / relative
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    return project


def started_training(project: Path, mnist_mirror: Path) -> subprocess.Popen[str]:
    """The train stage of `project`, returned once its batch progress bar shows that training has started."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.train"],
        cwd=project,
        env=stage_environment(mnist_mirror),
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    seen = ""
    while "epoch 1:" not in seen:
        chunk = process.stderr.read(64)
        assert chunk, f"stage ended before training started: {seen[-2000:]}"
        seen += chunk
    return process


def reproduced_copy(target: Path, mnist_mirror: Path, stage: str) -> Path:
    """A fresh project copy with quick params, after a successful `dvc repro <stage>`."""
    project = copy_without_outputs(target)
    write_params(project, tiny_params(read_params(project)))
    result = run_command(["dvc", "repro", stage], project, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    return project


def closed_port() -> int:
    """A localhost port nothing listens on: connections to it are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again on exit


def clone_project(source: Path, target: Path) -> Path:
    """A full copy of a project copy (workspace, DVC cache, stores), for a test that changes it."""
    shutil.copytree(source, target, symlinks=True)
    return target


def make_record(
    batch: int,
    device: str,
    mode: str,
    step_ms: float,
    operators: tuple[tuple[str, float], ...] = (),
    ci_pct: float = 2.0,
    load: float = 0.5,
    busy_pct: float = 90.0,
) -> ProfileRecord:
    """A profile record for report tests: the given median step time, its 95 % CI half-width (%), the load
    average while timing (2 cores), (operator, share %) rows and busy share.

    Its step analysis: a traced step twice the timed one, 1 MFLOP per sample, a 100 GFLOP/s peak."""
    combination = Combination(batch, device, mode)  # type: ignore[arg-type]
    device_ms = None if device == "cpu" else 0.0  # no GPU traced: no number
    rows = tuple(OperatorRow(name, 1.0, 0.1, 0.1, device_ms, device_ms, share, None) for name, share in operators)
    timing = Timing(
        step_time_ms_median=step_ms,
        step_time_ms_iqr=step_ms * 0.1,
        step_time_ms_ci_low=step_ms * (1 - ci_pct / 100),
        step_time_ms_ci_high=step_ms * (1 + ci_pct / 100),
        step_time_ci_pct=ci_pct,
        steps_measured=400,
        blocks_measured=100,
        steps_per_block=4,
        per_sample_ms=step_ms / batch,
        throughput_samples_per_s=1000 * batch / step_ms,
        noisy=ci_pct > 2.0,
        timing_s=3.0,
        peak_memory_mb=10.0,
        top_operator_share_pct=rows[0].share_pct if rows else 0.0,
    )
    settings = ProfileSettings(2, PROFILE_PRECISION, "channels_last", 3, 8, 1.0, 2.0, 10.0)
    conditions = MeasurementConditions(load, load, cores=2, threads=2, cpu_governor=GOVERNOR_NOT_EXPOSED)
    hardware = {"cpu": "Test CPU", "cpu_count": "2", "gpus": "none", "torch": "2.x"}
    verdict = "host-bound" if busy_pct < 50 else "device-bound"
    anatomy = StepAnatomy(
        device, 8, 2 * step_ms, 2 * step_ms * busy_pct / 100, busy_pct, 100 - busy_pct, 0, 0, 0, verdict, ""
    )
    analysis = StepAnalysis(anatomy, flop_rate(1e6, batch, step_ms, 100.0), "a 100 GFLOP/s stand-in", (), (), 0.0)
    return ProfileRecord(
        combination, hardware, settings, timing, conditions, (step_ms,) * 100, rows, "abc123", analysis
    )


SERVER_START_LIMIT_S = 120  # measured 20-30 s on two cores; generous for a loaded CI machine


@contextmanager
def running_mlflow_server(folder: Path, backend_store_uri: str | None = None) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1 (its SQLite store and artifacts in `folder` unless given);
    yields its URI once /health answers, stops it afterwards."""
    port = closed_port()
    store = backend_store_uri or f"sqlite:///{folder / 'server.db'}"
    command = [str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", store]
    command += ["--artifacts-destination", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen([*command, "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_LIMIT_S
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass  # not listening yet
            assert server.poll() is None, "mlflow server exited during start-up"
            assert time.monotonic() < deadline, f"mlflow server did not answer /health within {SERVER_START_LIMIT_S} s"
            time.sleep(0.5)
        yield uri
    finally:
        server.terminate()
        server.wait(timeout=30)


# Committed stage outputs the report reads for its training and graph figures (copied, never written).
REPORT_INPUTS = ("metrics/train.json", "plots/train_epochs.csv", "plots/train_steps.csv", "graph/model_graph.svg")


def run_report_stage(project: Path, experiment: str) -> Path:
    """The report stage run in process in `project` (an empty folder): two profile records, the committed
    training and graph outputs, its own MLflow store (`mlflow.db`, `experiment`) and TensorBoard folder (`runs`)."""
    import stages.report

    params = copy.deepcopy(REPO_PARAMS)
    params["profile"].update(batch_sizes=[1, 64], devices=["cpu"], modes=["inference"])
    params["tracking"].update(experiment=experiment, tensorboard_dir="runs")
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    for name in REPORT_INPUTS:
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, project / name)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("DVC_EXP_NAME", raising=False)
        write_two_profiles()
        stages.report.main()
    return project


def write_two_profiles() -> None:
    """Profile records and tables of batch 1 and 64 (cpu, inference) in the current folder, as the profile
    stage writes them: the report's inputs without running the pipeline."""
    from pipeline.common.paths import profile_outputs
    from pipeline.profiling.record import write_record
    from pipeline.profiling.texts import operators_markdown

    for record in (
        make_record(1, "cpu", "inference", 0.5, (("aten::mkldnn_convolution", 40.0),)),
        make_record(64, "cpu", "inference", 8.0, (("aten::max_pool2d", 30.0),)),
    ):
        paths = profile_outputs(record.combination.name)
        paths.folder.mkdir(parents=True)
        paths.record.write_text(write_record(record))
        paths.table_markdown.write_text(operators_markdown(record))
