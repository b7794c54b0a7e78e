"""`python -m pipeline.server`: one class's MLflow tracking server on PostgreSQL, with an account per student.

    init         a folder with a PostgreSQL cluster (databases `mlflow` and `mlflow_auth`), the artifact folder,
                 the Flask secret key and basic_auth.ini (both 0600), and the admin account
    start/stop   PostgreSQL, then `mlflow server --app-name basic-auth` with proxied artifacts (`--artifacts-
                 destination`: students need no storage credentials), bound to 127.0.0.1 unless --host says so
    status       what runs
    add-student  an account, its own experiment `<tracking.experiment>-<name>` and registered model
                 `<tracking.registered_model>-<name>`, and the lines the student types

Why one experiment per student: MLflow's permissions are per experiment and per registered model, with none per
run, so "a student writes only their own runs" can only be enforced by giving each their own experiment (and
model). `default_permission = NO_PERMISSIONS` hides the others; the instructor's admin account reads all, and
`python -m pipeline.machines --experiment '<tracking.experiment>-*'` compares every student's machine.

Passwords never touch a file, a command line or a log: the admin's comes from $MLFLOW_AUTH_ADMIN_PASSWORD (MLflow's
own variable) or a prompt and goes straight into the auth database as a hash; a student's from
$LAB_STUDENT_PASSWORD or is generated and printed once.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import requests

from pipeline.common.errors import PipelineError
from pipeline.common.stage_runner import run_stage
from pipeline.params.loading import load_params
from pipeline.server.postgres import Cluster, current_user, require_not_root

if TYPE_CHECKING:
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

DEFAULT_FOLDER = Path("~/mnist-lab-server")
ADMIN_PASSWORD_VARIABLE = "MLFLOW_AUTH_ADMIN_PASSWORD"  # MLflow's own name for it
JOB_EXECUTION_VARIABLE = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"  # MLflow's switch for its GenAI job runner
STUDENT_PASSWORD_VARIABLE = "LAB_STUDENT_PASSWORD"
AUTH_FUNCTION = "pipeline.server.auth:authenticate_request"
START_LIMIT_S = 120.0
STOP_LIMIT_S = 30.0
REQUEST_TIMEOUT_S = 30.0
STUDENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Settings:
    host: str
    port: int
    pg_port: int
    admin: str
    user: str  # the OS account (and PostgreSQL role) that runs the server
    experiment: str  # class prefix: each student's experiment is `<experiment>-<name>`
    registered_model: str
    allowed_hosts: str  # mlflow server --allowed-hosts ('' = MLflow's default: localhost only)
    backend: str = "postgresql"  # or "sqlite": files in the folder (one machine, few writers; the load benchmark)
    workers: int = 4  # mlflow server --workers (MLflow's default); each is a process that imports MLflow

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class ServerFolder:
    root: Path

    @property
    def settings_file(self) -> Path:
        return self.root / "server.json"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def auth_config(self) -> Path:
        return self.root / "basic_auth.ini"

    @property
    def secret_key(self) -> Path:
        return self.root / "secret_key"

    @property
    def log(self) -> Path:
        return self.root / "mlflow.log"

    @property
    def pid(self) -> Path:
        return self.root / "mlflow.pid"

    def store_uri(self, settings: Settings, database: str) -> str:
        """The database `mlflow` (runs) or `mlflow_auth` (accounts) of this server, as an SQLAlchemy URI."""
        if settings.backend == "sqlite":
            return f"sqlite:///{self.root / database}.db"
        return self.cluster(settings).uri(database)

    def cluster(self, settings: Settings) -> Cluster:
        return Cluster(self.root / "postgres", self.root / "socket", self.root / "postgres.log", settings.pg_port,
                       settings.user)  # fmt: skip

    def settings(self) -> Settings:
        try:
            return Settings(**json.loads(self.settings_file.read_text()))
        except FileNotFoundError:
            raise PipelineError(
                f"{self.root} is not a class server folder (no server.json). Create one with "
                f"`python -m pipeline.server init --dir {self.root}`, or pass the folder you created with --dir."
            ) from None


def run(arguments: Sequence[str] | None = None) -> None:
    """The command line: user errors become one paragraph and exit 2, Ctrl-C exits 130."""
    run_stage("class server", lambda: main(sys.argv[1:] if arguments is None else arguments))


def main(arguments: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_FOLDER, help=f"server folder (default: {DEFAULT_FOLDER})")
    commands = parser.add_subparsers(dest="command", required=True)
    init_parser = commands.add_parser("init", help="create the server folder, databases and admin account")
    init_parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    init_parser.add_argument("--port", type=int, default=5000, help="MLflow's port (default 5000)")
    init_parser.add_argument("--pg-port", type=int, default=5432, help="names PostgreSQL's socket; no TCP (5432)")
    init_parser.add_argument("--admin", default="admin", help="the instructor's admin account (default admin)")
    init_parser.add_argument("--allowed-hosts", default="", help="mlflow server --allowed-hosts, for a LAN name")
    init_parser.add_argument(
        "--backend", choices=("postgresql", "sqlite"), default="postgresql",
        help="where runs and accounts live (default postgresql; sqlite: files, for comparison)",
    )  # fmt: skip
    init_parser.add_argument(
        "--workers", type=_workers, default=4,
        help="MLflow server processes (default 4, MLflow's; fewer start faster and hold less memory on a small "
        "machine, more serve a bigger class)",
    )  # fmt: skip
    commands.add_parser("start", help="start PostgreSQL and the MLflow server")
    commands.add_parser("stop", help="stop the MLflow server and PostgreSQL")
    commands.add_parser("status", help="say what runs")
    student = commands.add_parser("add-student", help="an account, experiment and model for one student")
    student.add_argument("name", help="lower-case letters, digits, - and _ (the MLflow user name)")
    options = parser.parse_args(arguments)
    folder = ServerFolder(options.dir.expanduser().absolute())
    actions: dict[str, Callable[[], None]] = {
        "init": lambda: init(folder, options),
        "start": lambda: start(folder),
        "stop": lambda: stop(folder),
        "status": lambda: print(status(folder)),
        "add-student": lambda: add_student(folder, options.name),
    }
    actions[options.command]()


def _workers(text: str) -> int:
    """--workers: a whole number from 1 to 64 (argparse prints this message, names the option and exits 2)."""
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes from 1 to 64")
    return int(text)


def init(folder: ServerFolder, options: argparse.Namespace) -> None:
    if options.backend == "postgresql":
        require_not_root()
    if folder.root.exists() and any(folder.root.iterdir()):
        raise PipelineError(
            f"{folder.root} already exists and is not empty. Start that server with `python -m pipeline.server "
            f"--dir {folder.root} start`, or choose a new folder with --dir (nothing was changed)."
        )
    password = admin_password()
    tracking = load_params().tracking
    settings = Settings(options.host, options.port, options.pg_port, options.admin, current_user(),
                        tracking.experiment, tracking.registered_model, options.allowed_hosts,
                        options.backend, options.workers)  # fmt: skip
    partial = folder.root.with_name(f".{folder.root.name}.partial-{os.getpid()}")
    staged = ServerFolder(partial)
    try:
        partial.mkdir(mode=0o700, parents=True)
        staged.artifacts.mkdir(mode=0o700)
        if settings.backend == "postgresql":
            cluster = staged.cluster(settings)
            cluster.create()
            cluster.start()
            try:
                for database in ("mlflow", "mlflow_auth"):
                    cluster.create_database(database)
                create_admin(cluster.uri("mlflow_auth"), settings.admin, password)
            finally:
                cluster.stop()
        else:
            create_admin(staged.store_uri(settings, "mlflow_auth"), settings.admin, password)
        write_private(staged.secret_key, secrets.token_hex(32) + "\n")
        write_private(staged.settings_file, json.dumps(asdict(settings), indent=2) + "\n")
        if folder.root.exists():
            folder.root.rmdir()  # empty: checked above
        partial.rename(folder.root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    write_private(folder.auth_config, auth_config(folder.store_uri(settings, "mlflow_auth"), settings.admin))
    print(f"Class server folder {folder.root}: {settings.backend} databases mlflow and mlflow_auth, admin account "
          f"{settings.admin!r}. Next: python -m pipeline.server --dir {folder.root} start")  # fmt: skip


def admin_password() -> str:
    password = os.environ.get(ADMIN_PASSWORD_VARIABLE, "")
    if not password and sys.stdin.isatty():
        password = getpass.getpass("Admin password for the MLflow server (not stored; 12+ characters): ")
    if len(password) < 12:
        raise PipelineError(
            f"The admin password must come from ${ADMIN_PASSWORD_VARIABLE} or the prompt and have at least 12 "
            "characters; there is no default. Set it (e.g. `read -rs MLFLOW_AUTH_ADMIN_PASSWORD; export "
            "MLFLOW_AUTH_ADMIN_PASSWORD`) and run `init` again (nothing was created)."
        )
    return password


def auth_store(auth_uri: str) -> SqlAlchemyStore:
    """MLflow's own account store, on the auth database (through the instructor's socket: no password)."""
    with warnings.catch_warnings():  # importing the auth app warns about Starlette internals: not the user's business
        warnings.simplefilter("ignore")  # StarletteDeprecationWarning is not a DeprecationWarning subclass
        from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore  # lazy: MLflow's auth app is heavy

    store = SqlAlchemyStore()
    store.init_db(auth_uri)  # type: ignore[no-untyped-call]
    return store


def create_admin(auth_uri: str, name: str, password: str) -> None:
    store = auth_store(auth_uri)
    store.create_user(name, password, is_admin=True)
    store.engine.dispose()


# MLflow hashes the password of every request (PBKDF2/scrypt, a large share of a core-second) unless this cache is
# on: 30 students then queue behind the hashing for seconds a request, whatever the database
# (benchmarks/class_server_load.py; docs/measurements.md). MLflow's own cache keeps a successful check for the TTL,
# per worker; a changed or deleted password still works on the other workers until then. Refused logins are never
# cached.
AUTH_CACHE_TTL_S = 300


def auth_config(auth_uri: str, admin: str) -> str:
    """basic_auth.ini: no password in it (the admin exists already), students see nothing they were not given."""
    return (
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = {auth_uri}\n"
        f"admin_username = {admin}\n"
        f"authorization_function = {AUTH_FUNCTION}\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}\n"
    )


def write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only (0600) from the first byte."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    os.chmod(path, 0o600)


def server_pid(folder: ServerFolder) -> int | None:
    try:
        pid = int(folder.pid.read_text())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid


def healthy(settings: Settings) -> bool:
    try:
        return requests.get(f"{settings.url}/health", timeout=2).ok
    except requests.RequestException:
        return False


def start(folder: ServerFolder) -> None:
    settings = folder.settings()
    if settings.backend == "postgresql":
        folder.cluster(settings).start()
    if server_pid(folder) is None:
        command = [
            sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
            "--backend-store-uri", folder.store_uri(settings, "mlflow"),
            "--artifacts-destination", str(folder.artifacts),
            "--host", settings.host, "--port", str(settings.port), "--workers", str(settings.workers),
        ]  # fmt: skip
        if settings.allowed_hosts:
            command += ["--allowed-hosts", settings.allowed_hosts]
        environment = {key: value for key, value in os.environ.items() if key != ADMIN_PASSWORD_VARIABLE}
        environment.update(
            MLFLOW_AUTH_CONFIG_PATH=str(folder.auth_config),
            MLFLOW_FLASK_SERVER_SECRET_KEY=folder.secret_key.read_text().strip(),
            PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
        )
        # MLflow 3's job runner (huey consumers: more Python processes, for GenAI evaluation jobs) stays off unless
        # the instructor's environment switches it on: the lab logs runs, metrics and models and uses no jobs.
        environment.setdefault(JOB_EXECUTION_VARIABLE, "false")
        with folder.log.open("a") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                cwd=folder.root, start_new_session=True,
            )  # fmt: skip
        folder.pid.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + START_LIMIT_S
        while not healthy(settings):
            if process.poll() is not None or time.monotonic() > deadline:
                _end(process.pid)
                folder.pid.unlink(missing_ok=True)
                tail = " ".join(folder.log.read_text(errors="replace").split()[-60:])
                raise PipelineError(f"The MLflow server did not come up at {settings.url}: {tail} (log: {folder.log})")
            time.sleep(0.5)
    print(f"MLflow server on {settings.url} ({settings.backend}, accounts on; log {folder.log}).")


def _end(pid: int) -> None:
    """SIGTERM the server's process group (gunicorn/uvicorn and its workers), SIGKILL what is left after a while."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_LIMIT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop(folder: ServerFolder) -> None:
    settings = folder.settings()
    pid = server_pid(folder)
    if pid is not None:
        _end(pid)
    folder.pid.unlink(missing_ok=True)
    if settings.backend == "postgresql":
        folder.cluster(settings).stop()
    print(f"Stopped the class server in {folder.root}.")


def status(folder: ServerFolder) -> str:
    settings = folder.settings()
    if settings.backend == "postgresql":
        database = "PostgreSQL: " + ("running" if folder.cluster(settings).running() else "stopped")
    else:
        database = f"SQLite: {folder.store_uri(settings, 'mlflow')}"
    pid = server_pid(folder)
    server = f"running (pid {pid}), {'healthy' if healthy(settings) else 'not answering'}" if pid else "stopped"
    return f"{database}. MLflow server on {settings.url}: {server}."


@contextlib.contextmanager
def _session(user: str, password: str) -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.auth = (user, password)
        yield session


def add_student(folder: ServerFolder, name: str) -> None:
    if not STUDENT_NAME.match(name):
        raise PipelineError(
            f"Student name {name!r} is not allowed: use 1-32 lower-case letters, digits, '-' or '_', starting "
            "with a letter (it becomes the MLflow user name and part of the experiment's name)."
        )
    settings = folder.settings()
    if not healthy(settings):
        raise PipelineError(
            f"The class server at {settings.url} is not answering; start it first: "
            f"`python -m pipeline.server --dir {folder.root} start` (no account was created)."
        )
    given = os.environ.get(STUDENT_PASSWORD_VARIABLE, "")
    password = given or secrets.token_urlsafe(12)
    from mlflow.exceptions import MlflowException

    store = auth_store(folder.store_uri(settings, "mlflow_auth"))
    try:
        store.create_user(name, password)
    except MlflowException as error:
        raise PipelineError(
            f"The account {name!r} could not be created: {str(error).split(' Error:')[0]} Choose another name "
            "(nothing was changed)."
        ) from None
    finally:
        store.engine.dispose()
    experiment, model = f"{settings.experiment}-{name}", f"{settings.registered_model}-{name}"
    with _session(name, password) as session:  # as the student: MLflow makes the creator its manager
        for path, body in (
            ("experiments/create", {"name": experiment}),
            ("registered-models/create", {"name": model}),
        ):
            response = session.post(f"{settings.url}/api/2.0/mlflow/{path}", json=body, timeout=REQUEST_TIMEOUT_S)
            if not response.ok and "RESOURCE_ALREADY_EXISTS" not in response.text:
                raise PipelineError(f"Creating {body['name']!r} for {name!r} failed: HTTP {response.status_code}.")
    shown = "(the password you set in $LAB_STUDENT_PASSWORD)" if given else password
    print(
        f"Account {name!r}: experiment {experiment!r}, registered model {model!r}. Give the student these lines:\n"
        f"  export MLFLOW_TRACKING_URI={settings.url}\n"
        f"  export MLFLOW_TRACKING_USERNAME={name}\n"
        f"  export MLFLOW_TRACKING_PASSWORD={shown}\n"
        f"  export MLFLOW_EXPERIMENT_NAME={experiment}\n"
        f"  export LAB_REGISTERED_MODEL={model}"
    )
