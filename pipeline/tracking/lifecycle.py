"""A stage run's MLflow run from start to end: `open_tracker` starts it under the pipeline's parent run, hands the
stage its Tracker, and ends it FINISHED, FAILED or KILLED however the stage stops; the store's failures become one
paragraph naming the store and the fix, and the cleanup after a failure gets one short try per call."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.common.interrupts import raise_swallowed, shielded
from pipeline.common.outputs import flushed_before_commit
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.lineage import (
    PARENT_RUN_TAG,
    current_pipeline_run,
    mark_current,
    parent_run_id,
    reflect_children,
)
from pipeline.tracking.mlflow_run import MlflowRun
from pipeline.tracking.store import (
    check_artifact_folder,
    check_tracking_server,
    credentials_out_of_uri,
    mark_stale_runs,
    prepare_experiment,
    process_tags,
    project_root,
    tracking_uri,
    ui_url,
)
from pipeline.tracking.tags import (
    BASELINE_REV_TAG,
    EXPERIMENT_TAG,
    ID_TAG,
    NOTE_TAG,
    STAGE_TAG,
    WORKSPACE_TAG,
    machine_tags,
)
from pipeline.tracking.tensorboard_events import EventWriter
from pipeline.tracking.tracker import Tracker

if TYPE_CHECKING:  # imported lazily at run time: `import mlflow` alone takes seconds
    from mlflow import MlflowClient

# MLflow's default (10 s) leaves a GPU training of a few seconds without a single sample; psutil's
# sampling thread costs well under 1 % of a core at this rate.
SYSTEM_METRICS_INTERVAL_S = 2.0


# Shown as each run's description in the MLflow UI (the `mlflow.note.content` tag).
STAGE_DESCRIPTIONS = {
    "download": "Fetch the four MNIST IDX files, verify their SHA-256 digests and write data/MNIST.",
    "train": "Train the lab CNN (Adadelta + StepLR) on in-memory MNIST; checkpoint, metrics and curves.",
    "export_graph": "Export the trained model's dataflow graph: TensorBoard graph, torch.export .pt2, ONNX, summary.",
    "profile": "Time one batch size x device x mode and rank its operators with torch.profiler.",
    "report": "Build the lab report (markdown + self-contained HTML) from every stage's outputs.",
}


# How a client sees a server that cannot write an artifact: HTTP 500, or, when the server answers before it has read
# the whole upload (ENOSPC part-way through), the connection closed under the request.
_HTTP_500 = re.compile(r"(?<![\d=:])500(?!\d)")  # the status, not a port such as MLflow's default 5000
_CONNECTION_CLOSED = ("Connection aborted", "RemoteDisconnected", "reset by peer", "Broken pipe")


def _failure_hint(message: str) -> str:
    """What to check after a failed store call. An artifact upload that failed on every retry (HTTP 500, or the
    connection closed mid-upload) is most likely the server's storage failing (full, or not writable): the server's
    log names the error, the client only sees the status or the closed connection."""
    refused = _HTTP_500.search(message) is not None
    if "mlflow-artifacts" in message and (refused or any(sign in message for sign in _CONNECTION_CLOSED)):
        how = "HTTP 500" if refused else "the connection closed during the upload"
        return (
            f"The server failed to store an artifact ({how}, on every retry): its artifact storage is probably "
            "full or not writable, and the server's log says which (for the class server: mlflow.log in its "
            "folder). Free the space, or restart the server if it stopped"
        )
    return "Check that the store is up (and $MLFLOW_TRACKING_URI)"


def _first_line(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(str(text).split())[:500]


def _dvc_experiment_tags() -> dict[str, str]:
    """Inside `dvc exp run`, DVC names the experiment and its baseline commit: link the run to them."""
    names = {"DVC_EXP_NAME": EXPERIMENT_TAG, "DVC_EXP_BASELINE_REV": BASELINE_REV_TAG}
    return {tag: os.environ[variable] for variable, tag in names.items() if os.environ.get(variable)}


@contextlib.contextmanager
def open_tracker(
    stage: str,
    config: TrackingConfig,
    variant: str | None = None,
    root: Path | None = None,
    system_metrics: bool = False,
    current: bool = True,
    run_id: str | None = None,
) -> Iterator[Tracker]:
    """Start the stage's MLflow run and TensorBoard writer; end the run FINISHED, FAILED or KILLED.

    `variant` names one item of a matrix stage (`64-cpu-train`): the run is `stage@variant` and its
    TensorBoard folder `<stage>/<variant>-<time>-<run id>`, one per combination.

    The run is also the active fluent run while open, for the MLflow APIs that only exist in fluent
    form (`mlflow.log_input`, `mlflow.pytorch.log_model`). Every run is tagged with its stage, its DVC
    experiment (if any) and the machine it ran on (`machine.name`, `machine.id`).

    `system_metrics`: MLflow samples CPU, memory, disk, network (psutil) and GPU (pynvml, where a GPU
    and nvidia-ml-py are present) into `system/*` metrics while the run is open, every
    SYSTEM_METRICS_INTERVAL_S unless $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL says otherwise.

    `current=False`: a run that ends before its stage's outputs are committed (one per combination) does not yet
    become the workspace's current one; the stage settles it after the commit (`settle_runs`).

    `run_id`: a run this stage created before its work (`runs_started_early`), resumed instead of a new one.
    """
    import mlflow

    explicit_root = root is not None
    root = root or project_root()
    uri = credentials_out_of_uri(tracking_uri(root))
    if os.environ.get("MLFLOW_TRACKING_URI", "").strip():
        os.environ["MLFLOW_TRACKING_URI"] = uri  # MLflow code reading the variable sees no password either
    check_tracking_server(uri)
    # Against a server MLflow prints two "View run/experiment" links at every run's end, the parent's updates
    # included, none of them in the model-training view: the stage prints one line with it instead (_end_run).
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    machine = machine_tags()
    run_name = f"{stage}@{variant}" if variant else stage
    # Where this stage writes: the project folder, or a queued experiment's copy of it (project_root is then the
    # project the copy came from, whose store it logs to).
    workspace = str((root if explicit_root else Path.cwd()).resolve())
    client, experiment_id, run_id, parent_id = _start_run(
        uri, config.experiment, root, stage, run_name, machine, system_metrics, workspace, run_id
    )
    folder = f"{variant + '-' if variant else ''}{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:8]}"
    tensorboard_dir = Path(config.tensorboard_dir)
    tensorboard_dir = tensorboard_dir if tensorboard_dir.is_absolute() else root / tensorboard_dir
    tracker = Tracker(
        mlflow=MlflowRun(client, run_id),
        events=EventWriter(tensorboard_dir / stage / folder),
        tensorboard_dir=tensorboard_dir,
        experiment_id=experiment_id,
        machine_id=machine.get(ID_TAG, ""),
        parent_run_id=parent_id,
        uri=uri,
        root=root,
        workspace=workspace,
    )
    status = "FAILED"
    failure: PipelineError | None = None
    # Set where the cleanup below must not wait out the store's whole retry budget again (one_try_each).
    hurry = False
    try:
        with flushed_before_commit(tracker.before_commit):  # logged before the outputs move (pipeline.common.outputs)
            yield tracker
        tracker.flush()
        raise_swallowed()  # a stop whose exception a finalizer or callback dropped ends the run KILLED, not FINISHED
        status = "FINISHED"
    except KeyboardInterrupt:
        status, hurry = "KILLED", True
        raise
    except mlflow.exceptions.MlflowException as error:  # the store died, stalled or refused mid-stage
        hurry = True
        failure = PipelineError(
            redact(
                f"MLflow tracking store {uri} failed during the stage: {_first_line(error)}. No outputs were "
                f"written. {_failure_hint(str(error))}, then run the stage again."
            )
        )
        raise failure from None
    finally:
        cleanup = one_try_each() if hurry else contextlib.nullcontext()
        # A stopped stage's run ends KILLED even if another signal comes meanwhile (a third stops it at once).
        with cleanup, shielded() if status == "KILLED" else contextlib.nullcontext():
            _clean_up(tracker, uri, run_name, status, failure, current)


# The store's whole retry budget (store.HTTP_CLIENT_DEFAULTS: about a minute) is for riding out an outage while the
# stage works. Once a call has spent it, or the user stopped the stage, each cleanup call gets one try with a short
# timeout: a dead server would otherwise cost the budget again per call (flush, end the run, the parent), minutes
# before the stage exits. A run it cannot end stays RUNNING until the next stage on this machine marks it FAILED.
ONE_TRY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def _run_tags(
    uri: str, experiment: str, root: Path, stage: str, machine: dict[str, str], workspace: str
) -> tuple[MlflowClient, str, dict[str, str], str]:
    """What a stage's run is created with: (client, experiment id, its tags, its pipeline parent's run id). Opens
    the store (created, checked, stale runs of dead processes marked FAILED) on the way."""
    from mlflow import MlflowClient

    experiment_id = prepare_experiment(uri, experiment, root)
    client = MlflowClient(uri)
    check_artifact_folder(client.get_experiment(experiment_id).artifact_location)
    mark_stale_runs(client, experiment_id)
    pipeline = current_pipeline_run(root, machine)
    tags = {
        STAGE_TAG: stage,
        **pipeline.tags(),
        **process_tags(),
        **_dvc_experiment_tags(),
        WORKSPACE_TAG: workspace,
    }
    if stage in STAGE_DESCRIPTIONS:
        tags[NOTE_TAG] = STAGE_DESCRIPTIONS[stage]
    return client, experiment_id, tags, parent_run_id(client, experiment_id, pipeline, _dvc_experiment_tags())


@contextlib.contextmanager
def runs_started_early(stage: str, config: TrackingConfig, variants: list[str]) -> Iterator[dict[str, str]]:
    """One run per variant (`stage@variant`) created now, RUNNING under the pipeline parent with the tags
    `open_tracker` gives a run, before the stage's long work (MLflow imported and the store opened here, where the
    profile stage waits on its timing servers' imports anyway; a store that fails stops the stage before any work):
    {variant: run id}, each for `open_tracker(..., run_id=...)` to resume when the stage logs it. A stop or failure
    before then (Ctrl-C, SIGTERM, `dvc queue kill`) ends every run still RUNNING KILLED (FAILED for an error), and
    the pipeline parent takes their status, where runs created only after the work would not exist and the parent
    would read FINISHED. (A SIGKILL leaves them RUNNING until the next stage marks them FAILED, as any run.)"""
    import mlflow
    from sqlalchemy.exc import SQLAlchemyError  # lazy: MLflow's

    root = project_root()
    uri = credentials_out_of_uri(tracking_uri(root))
    check_tracking_server(uri)
    try:
        client, experiment_id, tags, parent = _run_tags(
            uri, config.experiment, root, stage, machine_tags(), str(Path.cwd().resolve())
        )
        runs = {
            variant: client.create_run(
                experiment_id, run_name=f"{stage}@{variant}", tags={**tags, PARENT_RUN_TAG: parent}
            ).info.run_id
            for variant in variants
        }
    except (mlflow.exceptions.MlflowException, SQLAlchemyError) as error:
        raise _failed_before_start(uri, error) from None
    try:
        yield runs
    except BaseException as error:
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        with shielded(), contextlib.suppress(mlflow.exceptions.MlflowException, SQLAlchemyError):
            for run_id in runs.values():
                if client.get_run(run_id).info.status == "RUNNING":
                    client.set_terminated(run_id, status)
            reflect_children(client, experiment_id, parent)
        raise


def _failed_before_start(uri: str, error: BaseException) -> PipelineError:
    return PipelineError(
        redact(
            f"MLflow tracking store {uri} failed before the stage started: {_first_line(error)}. Check "
            "$MLFLOW_TRACKING_URI (unset it to use the project's own mlflow.db) and `tracking.experiment` in "
            "params.yaml. Nothing was run."
        )
    )


@contextlib.contextmanager
def one_try_each() -> Iterator[None]:
    """MLflow's HTTP calls inside get one try each (it reads these variables on every request)."""
    saved = {name: os.environ.get(name) for name in ONE_TRY}
    os.environ.update(ONE_TRY)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _clean_up(
    tracker: Tracker, uri: str, run_name: str, status: str, failure: PipelineError | None, current: bool = True
) -> None:
    """What `stage_run` does however the stage ended: what the store still takes, the event file, the run's end."""
    import mlflow

    if tracker.unsent:  # interrupted or failed: keep what the store still takes
        with contextlib.suppress(mlflow.exceptions.MlflowException, OSError):
            tracker.flush()
    # Closing writes what the event file still buffers: on a full disk that fails, and the stage fails with it,
    # so its run must not end FINISHED, and must end all the same (not stay RUNNING behind the error).
    unwritten: OSError | None = None
    try:
        tracker.close()
    except OSError as error:
        if status == "FINISHED":  # the work was done: this is the stage's error (else the first one stands)
            unwritten, status = error, "FAILED"
    _end_run(tracker, uri, run_name, status, failure, current)
    if unwritten is not None:
        raise unwritten


def _start_run(
    uri: str,
    experiment: str,
    root: Path,
    stage: str,
    run_name: str,
    machine: dict[str, str],
    system_metrics: bool,
    workspace: str,
    existing: str | None = None,
) -> tuple[MlflowClient, str, str, str]:
    """The stage's run started (the active fluent run) under its pipeline parent: (client, experiment id, run id,
    parent run id); `existing`: that run, created earlier by this stage (`runs_started_early`), resumed.
    A store that fails here stops the stage before any work."""
    import mlflow
    from sqlalchemy.exc import SQLAlchemyError  # lazy: MLflow's

    try:
        client, experiment_id, tags, parent = _run_tags(uri, experiment, root, stage, machine, workspace)
        mlflow.set_tracking_uri(uri)
        if system_metrics:
            # Its start/stop/"skip GPU" INFO lines would join every training's console output; failures
            # are warnings and still show.
            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            if not os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"):
                mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)  # type: ignore[no-untyped-call]
        if existing is not None:
            run = mlflow.start_run(run_id=existing, log_system_metrics=system_metrics)
        else:
            run = mlflow.start_run(
                experiment_id=experiment_id,
                run_name=run_name,
                tags=tags,
                parent_run_id=parent,
                log_system_metrics=system_metrics,
            )
    except (mlflow.exceptions.MlflowException, SQLAlchemyError) as error:
        raise _failed_before_start(uri, error) from None
    return client, experiment_id, run.info.run_id, parent


def _reflect_in_parent(tracker: Tracker) -> None:
    """The pipeline parent's status follows this run's end (lineage.reflect_children); a store that fails here
    leaves the parent's old status, said on stderr, and does not fail a stage whose own run ended."""
    import mlflow

    if not tracker.parent_run_id:
        return
    try:
        reflect_children(tracker.client, tracker.experiment_id, tracker.parent_run_id)
    except mlflow.exceptions.MlflowException as error:
        print(
            f"warning: the pipeline run {tracker.parent_run_id} still shows its earlier status: updating it from "
            f"its stage runs failed ({_first_line(error)[:200]}).",
            file=sys.stderr,
        )


def _end_run(
    tracker: Tracker, uri: str, run_name: str, status: str, failure: PipelineError | None, current: bool = True
) -> None:
    """End the run with `status`; a FINISHED run becomes the workspace's current one for its stage. A store
    that fails here adds that to `failure`, or fails a stage that had finished."""
    import mlflow

    try:
        if status == "FINISHED" and current:
            mark_current(
                tracker.client, tracker.experiment_id, tracker.run_id, run_name, tracker.machine_id, tracker.workspace
            )
        mlflow.end_run(status=status)
        _reflect_in_parent(tracker)
        if status == "FINISHED" and uri.startswith(("http://", "https://")):
            print(f"MLflow run {run_name}: {ui_url(uri, tracker.experiment_id, tracker.run_id)}")
    except mlflow.exceptions.MlflowException as error:
        # The run stays RUNNING in the store; the next stage started on this machine marks it
        # FAILED (mark_stale_runs), once the store answers again.
        left = (
            f" Its MLflow run {tracker.run_id} could not be ended ({_first_line(error)[:200]}); it shows as RUNNING "
            "until the next stage started on this machine marks it FAILED."
        )
        if failure is not None:
            failure.args = (failure.args[0] + redact(left),)
        elif status == "FINISHED":
            raise PipelineError(
                redact(
                    f"The stage's work finished and its outputs were written, but MLflow store {uri} failed "
                    f"at its end.{left} Check the store, then run the stage again to log it."
                )
            ) from None


@contextlib.contextmanager
def settled_after_commit() -> Iterator[list[tuple[Tracker, str]]]:
    """For runs that end FINISHED before their stage's outputs are committed (`open_tracker(current=False)`, one per
    combination): append each with its run name to the list given. Entered before the stage's AtomicOutputs, this
    exits after their commit: each run then becomes the workspace's current one; if the stage stopped or failed
    before, each is marked KILLED, as its outputs never landed and the older ones still stand."""
    ended: list[tuple[Tracker, str]] = []
    try:
        yield ended
    except BaseException:
        with shielded():
            for tracker, _ in ended:
                tracker.client.set_terminated(tracker.run_id, status="KILLED")
        raise
    for tracker, run_name in ended:
        mark_current(
            tracker.client, tracker.experiment_id, tracker.run_id, run_name, tracker.machine_id, tracker.workspace
        )
