"""Project copies for the tests that run the real `dvc` CLI and stages: copied, cloned, reproduced with tiny
params, and the commands run in them (killed after a limit). The fixtures that share them live in conftest.py."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.metadata
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock

from tests.helpers.records import write_two_profiles
from tests.helpers.repo import REPO_PARAMS, REPO_ROOT, VENV_BIN
from tests.helpers.stores import empty_store


def project_files(root: Path = REPO_ROOT) -> list[str]:
    """The tracked and new (not ignored) files of the project at `root`, relative to it: what a project copy gets."""
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()


def copy_project(target: Path) -> Path:
    """The project's tracked and new files copied into a fresh git repo (no .venv, stores or data).

    Like a fresh clone: dvc.lock and code, but no data, caches or tracking stores.
    """
    for relative in project_files():
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


def processes_in(folder: Path) -> list[int]:
    """Processes (other than this one) whose working directory is inside `folder`: dvc, its stages, queue workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            working_directory = (entry / "cwd").resolve(strict=True)
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):  # gone meanwhile, or not ours to inspect
            continue
        if working_directory.is_relative_to(folder.resolve()) and "zombie" not in state:
            found.append(int(entry.name))
    return found


def processes_running(folder: Path, command_part: bytes) -> list[int]:
    """The processes working in `folder` (`processes_in`) whose command line contains `command_part`, read from
    /proc (a `dvc queue status` to ask would be a `dvc` start, ~1.5 s of CPU)."""
    found = []
    for pid in processes_in(folder):
        with contextlib.suppress(OSError):  # gone meanwhile
            if command_part in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def kill_processes_in(folder: Path) -> None:
    """SIGKILL every process working inside `folder`: queue workers (they idle 10 s before leaving) and the
    experiments they run; none may outlive the test that started them."""
    for pid in processes_in(folder):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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
    "metrics/profile_cpu.json",
    "profiles",
    "report",
)


def tiny_params(params: dict[str, Any]) -> dict[str, Any]:
    """The one small configuration every test uses (modified in place and returned).

    Training: one epoch over 3,200 images (50 steps, 5 log windows), seconds yet far past chance (0.87-0.89 over
    seeds 1-3, chance 0.10), evaluated on 2,000 test images.
    Profiling: 3 warm-up steps, 1 s of timing shared by 2 processes (0.5 s with glibc's default allocator) and 8
    traced steps per combination; the roofs stage's drift probe runs 1 s. One CPU thread each: the suite runs on
    two xdist workers, and two stages of two threads each on two cores wait on each other's threads (OpenMP spins)
    instead of working."""
    params["train"].update(epochs=1, train_samples=3200, test_samples=2000, log_every_steps=10, threads=1)
    params["profile"].update(
        warmup_steps=3,
        active_steps=8,
        time_budget_s=1.0,
        processes=2,
        program_starts=1,
        allocator_whatif_s=0.5,
        threads=1,
        drift_probe_s=1.0,
    )
    return params


def use_tiny_params(project: Path) -> None:
    """`project`'s params.yaml rewritten with the tiny configuration."""
    write_params(project, tiny_params(read_params(project)))


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


def default_sigint() -> None:
    """For `Popen(preexec_fn=...)` of a child that a test sends SIGINT: SIGINT at its default, as in a terminal.

    A suite started as a background job of a non-interactive shell (`make test &`, nohup, many job runners)
    inherits SIGINT ignored, and an ignored signal stays ignored across fork and exec; a stage respects that
    (README, "Bad input and failures"), so without this the test would depend on how pytest was started.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ignored_sigint() -> None:
    """For `Popen(preexec_fn=...)`: SIGINT ignored, as a background job of a non-interactive shell inherits it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def started_training(
    project: Path,
    mnist_mirror: Path,
    preexec: Callable[[], None] = default_sigint,
    until: str = "epoch 1:",
    extra: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """The train stage of `project` (with `extra` environment variables), returned once its stderr shows `until`
    (by default its batch progress bar: training has started); SIGINT at its default unless `preexec` says
    otherwise."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stages.train"],
        cwd=project,
        env=stage_environment(mnist_mirror, extra),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )
    assert process.stderr is not None
    seen = ""
    while until not in seen:
        chunk = process.stderr.readline()  # a line (tqdm's \r ends one too): read(n) could wait on a paused stage
        assert chunk, f"stage ended before {until!r}: {seen[-2000:]}"
        seen += chunk
    return process


def reproduced_copy(target: Path, mnist_mirror: Path, stage: str | None = None) -> Path:
    """A fresh project copy with quick params, after a successful `dvc repro <stage>` (all stages: None).
    Most tests clone the session's one (conftest: `reproduced_project`) instead of running the pipeline."""
    project = copy_without_outputs(target)
    write_params(project, tiny_params(read_params(project)))
    result = run_command(["dvc", "repro", *([stage] if stage else [])], project, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    return project


def clone_project(source: Path, target: Path) -> Path:
    """A full copy of a project copy (workspace, git, DVC cache, stores), for a test that changes it.

    The MLflow store keeps absolute paths (each experiment's artifact folder, each run's artifact URI, the
    registered model's files): they are pointed at the clone, so that nothing it logs lands in `source`.
    """
    shutil.copytree(source, target, symlinks=True)
    store = target / "mlflow.db"
    if store.is_file():
        with contextlib.closing(sqlite3.connect(store)) as database, database:
            for table, column in STORE_PATH_COLUMNS:
                database.execute(
                    f"UPDATE {table} SET {column} = replace({column}, ?, ?)",
                    (str(source), str(target)),
                )
    return target


def tree_digest(mnist_mirror: Path, root: Path = REPO_ROOT) -> str:
    """One digest of everything a tiny `dvc repro` of this tree depends on: the bytes of every file a project copy
    gets (code, params, dvc.yaml, requirements.txt, the tiny params in this module), the installed distributions,
    the interpreter, this machine and the MNIST mirror's checksums. Equal digests: the same pipeline on the same
    inputs, so one reproduced project serves both."""
    digest = hashlib.sha256()
    for relative in sorted(project_files(root)):
        if (root / relative).is_file():  # not a tracked file deleted from the worktree
            digest.update(f"{relative}\0".encode())
            digest.update((root / relative).read_bytes())
    distributions = sorted(f"{found.metadata['Name']}=={found.version}" for found in importlib.metadata.distributions())
    checksums = mnist_mirror / "SHA256SUMS"
    for part in (
        *distributions,
        sys.version,
        platform.node(),
        platform.machine(),
        str(mnist_mirror),
        checksums.read_text() if checksums.is_file() else "",
    ):
        digest.update(f"{part}\0".encode())
    return digest.hexdigest()[:16]


SESSION_DIGEST = pytest.StashKey[dict[Path, str]]()


def session_digest(config: pytest.Config, mnist_mirror: Path) -> str:
    """The tree's digest as it was when this test process started (`tree_digest`, remembered per mirror): a test on
    another worker may add or change a file of the tree for a moment, and a digest taken then would publish the
    project under a name no later session finds."""
    taken = config.stash.setdefault(SESSION_DIGEST, {})
    if mnist_mirror not in taken:
        taken[mnist_mirror] = tree_digest(mnist_mirror)
    return taken[mnist_mirror]


def published_reproduced(cache: Path, digest: str) -> Path | None:
    """The reproduced project an earlier test session published for the tree with `digest`, if there is one."""
    folder = cache / digest
    return folder / "project" if (folder / PUBLISHED).is_file() else None


PUBLISHED = "published"  # written last: a folder without it holds half a copy


def publish_reproduced(project: Path, cache: Path, digest: str) -> None:
    """A copy of `project` (a successful tiny `dvc repro` of the tree with `digest`) kept in `cache` for a later
    session of the same tree (`published_reproduced`), in place of any other tree's. The MLflow store's paths
    point at the copy (`clone_project`), so it is copied to its final place and marked complete last."""
    if published_reproduced(cache, digest) is not None:
        return
    for other in cache.iterdir():
        if other.is_dir():
            shutil.rmtree(other)
    clone_project(project, cache / digest / "project")
    (cache / digest / PUBLISHED).write_text(f"{project}\n")


def reproduced_cache(config: pytest.Config) -> Path | None:
    """pytest's cache folder for published projects; None with `-p no:cacheprovider`, where `config.cache`, set by
    that plugin, does not exist at all."""
    cache = getattr(config, "cache", None)
    return None if cache is None else Path(cache.mkdir("reproduced"))


def reproduced_or_published(config: pytest.Config, target: Path, mnist_mirror: Path) -> Path:
    """A project copy after a tiny `dvc repro` of the whole pipeline, for a test that changes it: a clone of the one an
    earlier session of this same tree published (`make test` before the stress sample in CI), else one reproduced
    here. A clone is seconds; reproducing is minutes, and the same pipeline on the same inputs gives the same
    project (`tree_digest`)."""
    cache = reproduced_cache(config)
    published = published_reproduced(cache, session_digest(config, mnist_mirror)) if cache is not None else None
    if published is not None:
        return clone_project(published, target)
    return reproduced_copy(target, mnist_mirror)


def build_reproduced(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path) -> Path:
    """The session's reproduced project (`reproduced_project`), built by the first worker that needs it and then
    published in pytest's cache (`publish_reproduced`) under this tree's digest, unless the cache is off
    (`-p no:cacheprovider`)."""

    def publish(project: Path) -> None:
        cache = reproduced_cache(config)
        if cache is not None:
            with FileLock(cache.parent / "reproduced.lock"):
                publish_reproduced(project, cache, session_digest(config, mnist_mirror))

    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: `-n 0` or `-p no:xdist`
        project = reproduced_copy(tmp_path_factory.mktemp("reproduced") / "project", mnist_mirror)
        publish(project)
        return project
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, common to this run's workers
    project, failed = shared / "reproduced" / "project", shared / "reproduced.failed"
    built_here = False
    with FileLock(shared / "reproduced.lock"):
        if failed.exists():
            pytest.fail(f"the shared reproduced project could not be built (by another worker):\n{failed.read_text()}")
        if not project.exists():
            try:
                reproduced_copy(project, mnist_mirror)
            except BaseException as error:
                failed.write_text(f"{type(error).__name__}: {error}")
                raise
            built_here = True
    if built_here:  # after the lock: the workers waiting for the project need not wait for its copy too
        publish(project)
    return project


# Where a SQLite MLflow store (3.17) holds absolute paths of the project it was made in.
STORE_PATH_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("tags", "value"),
    ("logged_models", "artifact_location"),
    ("logged_model_tags", "tag_value"),
    ("model_versions", "storage_location"),
)


# Committed stage outputs the report reads for its training and graph figures (copied, never written).
REPORT_INPUTS = (
    "hardware/fingerprint.json",
    "metrics/train.json",
    "metrics/graph.json",
    "plots/train_epochs.csv",
    "plots/train_steps.csv",
    "graph/model_graph.svg",
)


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
    empty_store(project)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("DVC_EXP_NAME", raising=False)
        write_two_profiles()
        stages.report.main()
    return project
