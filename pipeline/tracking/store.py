"""The MLflow tracking store: where it is, whether it answers, the experiment created once, and RUNNING runs
left by dead processes ended FAILED.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pwd
import re
import shutil
import sqlite3
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.common.credentials import basic_auth_header, redact, split_user_info
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import check_output_folder, size_text
from pipeline.common.processes import host_name, identity_alive, process_identity
from pipeline.tracking.lineage import PARENT_RUN_TAG, reflect_children
from pipeline.tracking.tags import NOTE_TAG

if TYPE_CHECKING:  # imported lazily at run time: `import mlflow` alone costs seconds
    from mlflow import MlflowClient
from pipeline.tracking.tags import HOST_TAG, PROCESS_TAG, STALE_TAG

STORE_FILE = "mlflow.db"
# A remote tracking server must neither hang a stage nor lose it to a restart. MLflow's own defaults are a 120 s
# timeout and 7 retries with exponential backoff (minutes). Here each request waits 8 s, and a refused, dropped,
# timed-out or 5xx request (MLflow retries every method, POST included) is retried 6 times after 0, 2, 4, 8, 16
# and 32 s (+ up to 1 s of MLflow's jitter each): an instructor's server restart or a PostgreSQL restart
# (docs/measurements.md) is ridden out, an outage past about a minute stops the stage with a message. The server's
# /health is still checked before any work (HEALTH_TIMEOUT_S): a server that is down at the start fails the stage at
# once. A user's explicit settings win.
HTTP_CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "8",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "6",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
}
HEALTH_TIMEOUT_S = 5.0
ARTIFACTS_DIR = "mlartifacts"
_EXPERIMENT_COPY_MARKER = (".dvc", "tmp", "exps")


def project_root(start: Path | None = None) -> Path:
    """The project folder; for a queued DVC experiment's copy, the project it was queued from."""
    here = (start or Path.cwd()).resolve()
    parts = here.parts
    for index in range(len(parts) - len(_EXPERIMENT_COPY_MARKER) + 1):
        if parts[index : index + len(_EXPERIMENT_COPY_MARKER)] == _EXPERIMENT_COPY_MARKER:
            return Path(*parts[:index])
    return here


def tracking_uri(root: Path | None = None) -> str:
    """$MLFLOW_TRACKING_URI if set, else an SQLite store at an absolute path in the project root."""
    configured = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if configured:
        return configured
    return f"sqlite:///{(root or project_root()) / STORE_FILE}"


# MLflow 3's UI opens on its GenAI pages (Overview, Traces, Judges, the model under "Agent versions") unless the URL
# says otherwise. MLflow 3.17's UI reads the view from this URL parameter first, then from the browser's local storage
# (its sidebar toggle), default GenAI; the experiment tag `mlflow.experimentKind` is not read while that toggle exists,
# and no server option sets it. So every link the pipeline gives carries it.
ML_VIEW_QUERY = "workflowType=machine_learning"
DEFAULT_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves


def ui_url(host: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's page of an experiment's runs (or of one run) in its model-training view; `host` is the
    server's URL (`http://127.0.0.1:5000`), or "" for a link within the UI (a run description's)."""
    page = f"#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{host.rstrip('/')}/{page}?{ML_VIEW_QUERY}" if host else f"{page}?{ML_VIEW_QUERY}"


def view_hint(uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """Where to look at a run in MLflow's UI: the server's page, or for the default SQLite store the `mlflow ui`
    command and the page it serves."""
    if uri.startswith(("http://", "https://")):
        return ui_url(uri, experiment_id, run_id)
    store = _sqlite_path(uri)
    if store is not None and store.name == STORE_FILE:
        return (
            f"`mlflow ui --backend-store-uri sqlite:///{STORE_FILE}`, then {ui_url(DEFAULT_UI, experiment_id, run_id)}"
        )
    return f"`mlflow ui --backend-store-uri {uri}`, then {ui_url(DEFAULT_UI, experiment_id, run_id)}"


USERNAME_VARIABLE = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"
TOKEN_VARIABLE = "MLFLOW_TRACKING_TOKEN"


def credentials_out_of_uri(uri: str, environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """`uri` without `user:password@`, the credentials moved to MLflow's own variables; returns the bare URI.

    MLflow sends MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD as HTTP basic auth. Taken out of
    the URI, the password cannot reach any message, log or exception text that quotes the URI.
    Variables the user set explicitly win over the URI, as they do in MLflow.
    """
    if not uri.startswith(("http://", "https://")):
        return uri  # database URIs need their credentials inside; messages redact them instead
    bare, user, password = split_user_info(uri)
    if user is not None:
        environ.setdefault(USERNAME_VARIABLE, user)
        environ.setdefault(PASSWORD_VARIABLE, password or "")
    return bare


def check_tracking_server(uri: str) -> None:
    """For an http(s) tracking URI: the server must answer `GET /health` before any work starts.

    The request carries the credentials MLflow itself would send (basic auth from
    MLFLOW_TRACKING_USERNAME / _PASSWORD, or a bearer MLFLOW_TRACKING_TOKEN), so a server behind auth
    passes; a `user:password@` in the URI is honoured the same way and never printed.
    """
    if not uri.startswith(("http://", "https://")):
        return
    for name, value in HTTP_CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    uri = credentials_out_of_uri(uri)
    health = uri.rstrip("/") + "/health"
    fix = (
        "Start the server (README: 'Sharing: DVC remote and MLflow server'), correct $MLFLOW_TRACKING_URI, "
        "or unset it to log into the project's own mlflow.db. Nothing was run."
    )
    request = urllib.request.Request(health)
    if os.environ.get(USERNAME_VARIABLE):
        header = basic_auth_header(os.environ[USERNAME_VARIABLE], os.environ.get(PASSWORD_VARIABLE, ""))
        request.add_unredirected_header("Authorization", header)
    elif os.environ.get(TOKEN_VARIABLE):
        request.add_unredirected_header("Authorization", f"Bearer {os.environ[TOKEN_VARIABLE]}")
    try:
        with urllib.request.urlopen(request, timeout=HEALTH_TIMEOUT_S) as response:
            response.read()
    except urllib.error.HTTPError as error:
        auth = (
            f" Check {USERNAME_VARIABLE} / {PASSWORD_VARIABLE} (or the user:password in the URI)."
            if error.code in (401, 403)
            else ""
        )
        raise PipelineError(
            redact(f"MLflow tracking server {uri} answered HTTP {error.code} on /health.{auth} {fix}")
        ) from None
    except OSError as error:  # refused, DNS, timeout
        reason = getattr(error, "reason", error)
        raise PipelineError(redact(f"MLflow tracking server {uri} is unreachable ({reason}). {fix}")) from None


def check_sqlite_store(database: Path) -> None:
    """Refuse a damaged SQLite store up front instead of failing inside SQLAlchemy with a traceback.

    An empty (0-byte) file is refused too: MLflow would silently make a new store of it, hiding that
    the runs it held are gone (a disk that filled up, a bad copy). Called under the store's lock, so
    a store another process is creating right now is never judged half-made.
    """
    if not database.exists():
        return
    fix = (
        f"Move it aside (`mv {database} {database}.damaged`) to start an empty store (its runs are lost unless "
        "you restore a backup), or point $MLFLOW_TRACKING_URI at another store. Nothing was run."
    )
    if not database.is_file():
        raise PipelineError(f"MLflow store {database} is not a file. {fix}")
    if database.stat().st_size == 0:
        raise PipelineError(f"MLflow store {database} is empty (0 bytes): whatever runs it held are gone. {fix}")
    try:
        with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=rw", uri=True, timeout=60)) as connection:
            (verdict,) = connection.execute("PRAGMA quick_check(1)").fetchone()
    except sqlite3.DatabaseError as error:  # "file is not a database", "database disk image is malformed"
        raise PipelineError(f"MLflow store {database} is not a readable SQLite database ({error}). {fix}") from None
    if verdict != "ok":
        raise PipelineError(f"MLflow store {database} is damaged (SQLite's check: {verdict}). {fix}")


STORE_MIN_FREE_BYTES = 16 << 20  # a stage's runs add kilobytes to the store; SQLite's journal needs room beside it


def check_store_writable(database: Path) -> None:
    """A SQLite store this user can write, with room to grow, before any run starts in it: SQLite writes the file
    and, beside it, its journal, and the stages their lock (`mlflow.db.lock`), so the file and its folder must both
    take writes. Otherwise MLflow fails at its first INSERT, with its own tracebacks and the raw SQL."""
    folder = database.parent
    blocked = [
        (what, path)
        for what, path in (("the file", database), ("its folder", folder))
        if path.exists() and not os.access(path, os.W_OK)
    ]
    if blocked:
        user = _user_name()
        owner = _owner_name(database if database.exists() else folder)
        fix = " and ".join(f"`chmod u+w {path}`" for _, path in blocked)
        named = " and ".join(f"{what} {path}" for what, path in blocked)
        raise PipelineError(
            f"MLflow store {database} cannot be written by this user ({user}): {named} "
            f"{'is' if len(blocked) == 1 else 'are'} read-only for it (owner: {owner}). SQLite writes the store and, "
            f"beside it, its journal, and the stages a lock, so both must take writes: {fix} as {owner}, run as "
            "that user, or point $MLFLOW_TRACKING_URI at a store you can write. Nothing was run."
        )
    if folder.is_dir() and shutil.disk_usage(folder).free < STORE_MIN_FREE_BYTES:
        raise PipelineError(
            f"MLflow store {database}: its file system has only {size_text(shutil.disk_usage(folder).free)} free, "
            f"and SQLite needs room beside the store for its journal. Free space on the file system holding {folder}/ "
            "and run again. Nothing was run."
        )


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def _owner_name(path: Path) -> str:
    uid = path.stat().st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_artifact_folder(artifact_uri: str) -> None:
    """A local artifact store must accept files and have room before the work, not after it: a full
    mlartifacts/ would otherwise throw away a finished training when its model is logged."""
    if artifact_uri.startswith("file://"):
        folder = Path(urllib.request.url2pathname(artifact_uri[len("file://") :]))
    elif "://" not in artifact_uri and ":/" not in artifact_uri:
        folder = Path(artifact_uri)  # a plain local path
    else:
        return  # remote stores (mlflow-artifacts:, s3:, ...) report their own errors
    check_output_folder(folder)


def process_tags() -> dict[str, str]:
    return {HOST_TAG: host_name(), PROCESS_TAG: process_identity()}


def mark_stale_runs(client: MlflowClient, experiment_id: str) -> list[str]:
    """End as FAILED the RUNNING runs whose process is gone (SIGKILL, OOM killer, a store that was down
    at the end); return their ids.

    Only runs started on this machine are judged: another machine's processes cannot be checked
    from here, so its runs are left as they are (that machine's next stage judges them).
    """
    host = host_name()
    stale = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        identity = tags.get(PROCESS_TAG)
        if tags.get(HOST_TAG) != host or identity is None or identity_alive(identity):
            continue
        note = f"marked FAILED by a later stage: its process ({identity}) ended without closing the run"
        client.set_tag(run.info.run_id, STALE_TAG, note)
        client.set_terminated(run.info.run_id, "FAILED")
        stale.append(run.info.run_id)
        if tags.get(PARENT_RUN_TAG):  # its pipeline parent shows the failure too
            reflect_children(client, experiment_id, tags[PARENT_RUN_TAG])
    return stale


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def prepare_experiment(uri: str, experiment: str, root: Path) -> str:
    """Create (once) the store and the experiment; return the experiment id.

    A SQLite store is created, completed or upgraded (settle_sqlite_store) under a file lock beside the
    database: two processes migrating one store at once race ("duplicate column name").
    """
    from mlflow import MlflowClient

    database = _sqlite_path(uri)
    if database is not None:
        check_store_writable(database)
    lock_context: contextlib.AbstractContextManager[object] = (
        _file_lock(database.with_name(database.name + ".lock")) if database else contextlib.nullcontext()
    )
    with lock_context:
        if database is not None:
            check_sqlite_store(database)
            settle_sqlite_store(database)
        client = MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            if database is not None and database.parent == root:
                expected = (root / ARTIFACTS_DIR / _slug(experiment)).as_uri()
                if found.artifact_location != expected:
                    relocate_artifacts(database, found.artifact_location, expected)
            return found.experiment_id
        location = None
        if database is not None and database.parent == root:
            # Keep artifacts beside the default store instead of under whatever cwd created it.
            location = (root / ARTIFACTS_DIR / _slug(experiment)).as_uri()
        description = (
            "AI-System Lab 1: MNIST CNN training, dataflow graph and operator profiles, one run per DVC stage "
            "(children of a `pipeline@<commit>-<params>` run per `dvc repro`). Written by this project's pipeline."
        )
        return client.create_experiment(experiment, artifact_location=location, tags={NOTE_TAG: description})


# Where a SQLite MLflow store (3.17) holds its artifacts' absolute locations: each experiment's folder, each run's,
# each logged model's and each registered version's.
ARTIFACT_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
)


def relocate_artifacts(database: Path, found: str, expected: str) -> bool:
    """Point a project's own store at its own `mlartifacts/` where it names another folder's: the store keeps each
    location as an absolute path, so a project copied (`cp -r`) or moved would log every new run into the folder it
    came from. Only a location of this pipeline's own layout (`<folder>/mlartifacts/<experiment>`) is moved, with
    every run, logged model and registered version under it, in one transaction; the runs' history (their tags)
    keeps what it says. Says so on stderr. False where the location is one a user chose (left as it is)."""
    old_prefix, _, slug = found.rpartition("/")
    new_prefix, _, expected_slug = expected.rpartition("/")
    if slug != expected_slug or not old_prefix.endswith(f"/{ARTIFACTS_DIR}") or not found.startswith("file://"):
        return False
    old_path = urllib.request.url2pathname(old_prefix[len("file://") :])
    new_path = urllib.request.url2pathname(new_prefix[len("file://") :])
    changed = 0
    with contextlib.closing(sqlite3.connect(database, timeout=60)) as connection, connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column in ARTIFACT_COLUMNS:
            if table not in tables:
                continue
            for old, new in ((old_prefix + "/", new_prefix + "/"), (old_path + "/", new_path + "/")):
                changed += connection.execute(
                    f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
                    (new, len(old) + 1, len(old), old),
                ).rowcount
    print(
        f"MLflow store {database} kept its artifacts in {old_path}/ (the project it was copied or moved from): "
        f"pointed it at this project's {new_path}/ instead ({changed} location(s)), so that nothing is logged "
        "outside this project.",
        file=sys.stderr,
    )
    return True


_BUILDING_SUFFIX = ".building"  # `mlflow.db.building-<pid>`: a store being built or upgraded aside


def settle_sqlite_store(database: Path) -> None:
    """Make `database` a complete MLflow store at MLflow's current schema, all or nothing; call under its lock.

    MLflow creates and migrates a SQLite store in place, in dozens of statements SQLite commits one by one: a
    stage stopped meanwhile left a half-built store that every later run failed on ("table logged_models already
    exists"). Here a store is built, or copied and upgraded, in a file beside it, and renamed into place only when
    complete, so a stop at any moment leaves the old store or the new one; what a stopped build left aside is
    removed by the next. A half-built store left by MLflow itself (an interrupted `mlflow ui`, or an older version
    of this pipeline) that holds no runs is rebuilt, saying so on stderr. A database with runs that this MLflow
    cannot upgrade, or whose tables are not MLflow's, is refused with a message.
    """
    for leftover in database.parent.glob(f"{database.name}{_BUILDING_SUFFIX}-*"):
        leftover.unlink(missing_ok=True)  # under the lock: every builder is gone
    if not database.exists():
        _build_aside(database, source=None)
        return
    state = store_state(database)
    if state.complete:
        return
    fix = (
        f"Move it aside (`mv {database} {database}.other`) to start an empty store here, or point "
        "$MLFLOW_TRACKING_URI at another store. Nothing was run."
    )
    if state.foreign_tables:
        raise PipelineError(
            f"MLflow store {database} is not an MLflow store: it holds tables MLflow does not make "
            f"({', '.join(sorted(state.foreign_tables)[:5])}). {fix}"
        )
    if state.runs == 0:
        _build_aside(database, source=None)
        print(
            f"MLflow store {database} was half-built (its creation was stopped: schema revision "
            f"{state.revision or 'none'} of {state.head}) and held no runs: rebuilt it.",
            file=sys.stderr,
        )
        return
    if not state.known_revision:
        raise PipelineError(
            f"MLflow store {database} holds {state.runs} runs at schema revision {state.revision or 'none'}, which "
            f"this MLflow ({_mlflow_version()}) does not know: it was made by another MLflow version. Use that "
            f"version, or: {fix}"
        )
    try:
        _build_aside(database, source=database)
    except Exception as error:  # SQLAlchemy's or Alembic's: a migration this store's state does not allow
        raise PipelineError(
            f"MLflow store {database} holds {state.runs} runs at schema revision {state.revision}, and upgrading a "
            f"copy of it to {state.head} failed ({str(error).splitlines()[0][:200]}); the store is as it was. "
            f"Upgrade it with the MLflow version that made it, or: {fix}"
        ) from None
    print(
        f"MLflow store {database} upgraded from schema revision {state.revision} to {state.head} "
        f"({state.runs} runs kept).",
        file=sys.stderr,
    )


@dataclasses.dataclass(frozen=True)
class _StoreState:
    complete: bool
    runs: int
    revision: str | None
    head: str
    known_revision: bool
    foreign_tables: frozenset[str]


def store_state(database: Path) -> _StoreState:
    """What a store's tables and Alembic revision say about it, read with sqlite3 (no migration started)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=60)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        revisions = (
            [row[0] for row in connection.execute("SELECT version_num FROM alembic_version")]
            if "alembic_version" in tables
            else []
        )
        runs = connection.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))  # type: ignore[no-untyped-call]
    head = script.get_current_head() or ""
    revision = revisions[0] if len(revisions) == 1 else None
    known = {rev.revision for rev in script.walk_revisions()}
    mlflow_tables = set(Base.metadata.tables) | set(InitialBase.metadata.tables)
    foreign = {
        name
        for name in tables
        if name not in mlflow_tables and not name.startswith(("alembic_", "_alembic_tmp_", "sqlite_"))
    }
    return _StoreState(
        complete=set(Base.metadata.tables) <= tables and revision == head,
        runs=int(runs),
        revision=revision,
        head=head,
        known_revision=revision in known,
        foreign_tables=frozenset(foreign),
    )


def _build_aside(database: Path, source: Path | None) -> None:
    """A complete store (new, or `source` copied and upgraded) built beside `database`, then renamed over it."""
    from mlflow.store.db.utils import _initialize_tables, _upgrade_db, create_sqlalchemy_engine

    aside = database.with_name(f"{database.name}{_BUILDING_SUFFIX}-{os.getpid()}")
    aside.unlink(missing_ok=True)
    try:
        if source is not None:
            with (
                contextlib.closing(sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=60)) as old,
                contextlib.closing(sqlite3.connect(aside)) as new,
            ):
                old.backup(new)
        engine = create_sqlalchemy_engine(f"sqlite:///{aside}")  # type: ignore[no-untyped-call]
        try:
            if source is None or not _tables_complete(aside):
                # Creates the tables that are missing, then migrates to the head revision.
                _initialize_tables(engine)  # type: ignore[no-untyped-call]
            else:
                _upgrade_db(engine)  # type: ignore[no-untyped-call]
        finally:
            engine.dispose()
        with aside.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(aside, database)
        folder = os.open(database.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    finally:
        aside.unlink(missing_ok=True)
        aside.with_name(aside.name + "-journal").unlink(missing_ok=True)


def _tables_complete(database: Path) -> bool:
    from mlflow.store.db.base_sql_model import Base

    with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, timeout=60)) as connection:
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return set(Base.metadata.tables) <= tables


def _mlflow_version() -> str:
    import mlflow

    return f"MLflow {mlflow.__version__}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "experiment"
