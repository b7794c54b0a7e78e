"""The SQLite tracking store's creation is all or nothing: a stage stopped at any moment of it leaves no store or a
complete one, and a store half-built by MLflow itself (in place) is rebuilt when it holds no runs. Real MLflow, real
signals (tests/helpers/store_stops.py stops a creation at its Nth SQL statement)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.common.stage_runner import run_stage
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.store import store_state
from tests.helpers.repo import REPO_ROOT
from tests.helpers.stores import empty_store

pytestmark = pytest.mark.slow
MOMENTS = 10
EXPERIMENT = "store-test"


@pytest.fixture(autouse=True)
def _no_tracking_uri_left() -> Iterator[None]:
    """mlflow.set_tracking_uri (each stage run here, in process) sets $MLFLOW_TRACKING_URI: gone after each test, so
    that no later test or child process logs into this test's store."""
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


def _stops(request: dict[str, object]) -> object:
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.store_stops", json.dumps(request)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _statements(mode: str, folder: Path) -> int:
    """How many SQL statements a store's creation takes: by a stage (`pipeline`), or by MLflow itself (`mlflow`)."""
    count = _stops({"mode": mode, "count": True, "folders": [str(folder)], "stops": []})
    assert isinstance(count, int) and count > 50
    return count


def _stage_on(folder: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A stage run whose store is `folder`/mlflow.db, as a stage script runs it: exit code, stderr."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # mlflow.set_tracking_uri sets it, for the last store

    def stage() -> None:
        with open_tracker("probe", TrackingConfig(EXPERIMENT, "runs", "lab-model"), root=folder) as tracker:
            tracker.log_metrics({"probe": 1.0}, step=0)

    try:
        run_stage("probe", stage)
    except SystemExit as exited:
        return int(exited.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


def _finished_runs(folder: Path) -> list[str]:
    """The statuses of the probe stage's runs in `folder`'s store."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`mlflow.runName` = 'probe'")
    return [run.info.status for run in runs]


def _spread(statements: int, first: int = 1) -> list[int]:
    return [first + (statements - first) * index // (MOMENTS - 1) for index in range(MOMENTS)]


def test_a_stage_stopped_at_ten_moments_of_the_store_creation_leaves_the_next_run_working(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folders = [tmp_path / f"moment-{index}" for index in range(MOMENTS)]
    statements = _statements("pipeline", tmp_path / "count")
    stops = [[at, signal.SIGKILL if index % 2 else signal.SIGINT] for index, at in enumerate(_spread(statements))]
    statuses = _stops({"mode": "pipeline", "folders": [str(f) for f in folders], "stops": stops})
    assert statuses == [-signal.SIGKILL if index % 2 else 1 for index in range(MOMENTS)]  # each one stopped
    for folder in folders:
        database = folder / "mlflow.db"
        assert not database.exists() or store_state(database).complete, "a stopped creation left a half-built store"
        code, stderr = _stage_on(folder, capsys, monkeypatch)
        assert code == 0, f"{folder.name}: {stderr}"
        assert _finished_runs(folder) == ["FINISHED"]
        assert sorted(path.name for path in folder.iterdir() if path.name.startswith("mlflow.db")) == [
            "mlflow.db",
            "mlflow.db.lock",
        ], "what the stopped build left aside was not removed"


def test_a_store_half_built_in_place_with_no_runs_is_rebuilt_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folders = [tmp_path / f"moment-{index}" for index in range(MOMENTS)]
    # From a twentieth of the way on: before its first table MLflow has written nothing but an empty file, which a
    # stage refuses as a store whose runs are gone (tests/test_hostile_files.py).
    statements = _statements("mlflow", tmp_path / "count")
    stops = [[at, signal.SIGKILL] for at in _spread(statements - 1, first=statements // 20)]
    assert _stops({"mode": "mlflow", "folders": [str(f) for f in folders], "stops": stops}) == [-9] * MOMENTS
    half_built = 0
    for folder in folders:
        complete = store_state(folder / "mlflow.db").complete  # the last moments come after MLflow's migration
        half_built += not complete
        code, stderr = _stage_on(folder, capsys, monkeypatch)
        assert code == 0, f"{folder.name}: {stderr}"
        said = f"MLflow store {folder / 'mlflow.db'} was half-built" in stderr and "held no runs: rebuilt it" in stderr
        assert said != complete, stderr
        assert _finished_runs(folder) == ["FINISHED"]
    assert half_built >= MOMENTS - 2


def _sql(database: Path, *statements: str) -> None:
    with sqlite3.connect(database) as connection:
        for statement in statements:
            connection.execute(statement)
    connection.close()


STORE_CASES: list[tuple[str, Callable[[Path], object], list[str]]] = [
    (
        "someone else's tables",
        lambda db: (db.unlink(), _sql(db, "CREATE TABLE invoices (id INTEGER)", "INSERT INTO invoices VALUES (1)")),
        ["is not an MLflow store", "invoices", "mv {db} {db}.other"],
    ),
    (
        "a newer MLflow's revision",
        lambda db: _sql(
            db,
            "INSERT INTO experiments (name, artifact_location, lifecycle_stage, workspace) VALUES ('x', '/x', "
            "'active', 'default')",
            "INSERT INTO runs (run_uuid, experiment_id, lifecycle_stage) VALUES ('r1', 1, 'active')",
            "UPDATE alembic_version SET version_num = 'ffffffffffff'",
        ),
        ["holds 1 runs at schema revision ffffffffffff", "does not know", "mv {db} {db}.other"],
    ),
]


@pytest.mark.parametrize(("name", "change", "expected"), STORE_CASES, ids=[case[0] for case in STORE_CASES])
def test_a_store_that_is_not_ours_is_refused_with_a_fix_that_works(
    tmp_path: Path,
    name: str,
    change: Callable[[Path], object],
    expected: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    empty_store(tmp_path)
    database = tmp_path / "mlflow.db"
    change(database)
    before = database.read_bytes()
    code, stderr = _stage_on(tmp_path, capsys, monkeypatch)
    assert code == 2 and "Traceback" not in stderr, stderr
    for text in expected:
        assert text.format(db=database) in stderr, stderr
    assert database.read_bytes() == before
    database.rename(f"{database}.other")  # the fix the message gives
    code, stderr = _stage_on(tmp_path, capsys, monkeypatch)
    assert code == 0, stderr
    assert _finished_runs(tmp_path) == ["FINISHED"]


# A store this user cannot write: the file, its folder, or both read-only for the user the stage runs as (as root,
# the test drops to `nobody`, since root writes anything; as anyone else, the modes alone do it).
READ_ONLY_CASES = {"file": ("mlflow.db",), "folder": (".",), "both": ("mlflow.db", ".")}
OPEN_STORE = (
    "import sys\n"
    "from pathlib import Path\n"
    "from pipeline.common.errors import PipelineError\n"
    "from pipeline.tracking.store import prepare_experiment\n"
    "try:\n"
    "    prepare_experiment(f'sqlite:///{sys.argv[1]}/mlflow.db', 'mnist-lab', Path(sys.argv[1]))\n"
    "except PipelineError as error:\n"
    "    print(error, file=sys.stderr)\n"
    "    sys.exit(2)\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(READ_ONLY_CASES))
def test_a_store_this_user_cannot_write_is_named_in_one_paragraph_before_any_run(case: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="read-only-store-"))  # not under pytest's tmp folders, which are 0700
    try:
        folder.chmod(0o777)
        empty_store(folder)
        (folder / "mlflow.db").chmod(0o666)
        for name in READ_ONLY_CASES[case]:
            (folder / name).chmod(0o555 if name == "." else 0o444)
        before = (folder / "mlflow.db").read_bytes()
        drop = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
        result = subprocess.run(
            [*drop, sys.executable, "-c", OPEN_STORE, str(folder)],
            cwd=REPO_ROOT,
            env={**os.environ, "HOME": str(folder)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2, result.stderr[-3000:]
        said = result.stderr.strip()
        assert "Traceback" not in said and "INSERT" not in said and "\n" not in said, said
        assert f"MLflow store {folder / 'mlflow.db'} cannot be written by this user" in said, said
        for what, name in (("the file", "mlflow.db"), ("its folder", ".")):
            path = folder / name if name != "." else folder
            assert (f"{what} {path}" in said) == (name in READ_ONLY_CASES[case]), said
            assert (f"`chmod u+w {path}`" in said) == (name in READ_ONLY_CASES[case]), said
        assert "Nothing was run." in said
        assert (folder / "mlflow.db").read_bytes() == before
    finally:
        folder.chmod(0o755)
        for path in folder.iterdir():
            path.chmod(0o644)
        shutil.rmtree(folder)
