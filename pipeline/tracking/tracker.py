"""MLflow + TensorBoard for one stage run, behind one small facade that stages pass around.

Where things go by default (so `mlflow ui` and `tensorboard --logdir runs` in the project root see
every run, including those of queued `dvc exp run` copies under .dvc/tmp/exps):

    <project>/mlflow.db       MLflow tracking store (SQLite); $MLFLOW_TRACKING_URI overrides it
    <project>/mlartifacts/    MLflow artifacts of that store
    <project>/runs/<stage>/<time>-<run id>/   TensorBoard, one folder per stage run
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import flushed_before_commit
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.hparams import write_experiment
from pipeline.tracking.lineage import (
    current_pipeline_run,
    mark_current,
    outputs_md5,
    parent_run_id,
    producer_run,
    reflect_children,
    training_run,
)
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
    view_hint,
)
from pipeline.tracking.tags import (
    BASELINE_REV_TAG,
    EXPERIMENT_TAG,
    ID_TAG,
    INPUT_TAG_PREFIX,
    MODEL_ID_TAG,
    MODEL_URI_TAG,
    NOTE_TAG,
    OUTPUTS_MD5_TAG,
    STAGE_TAG,
    TRAIN_RUN_TAG,
    WORKSPACE_TAG,
    machine_tags,
)
from pipeline.tracking.tensorboard_events import EventWriter, HParam, hparams_session

if TYPE_CHECKING:  # imported lazily at run time: `import mlflow` alone costs ~2 s
    import numpy as np
    import torch
    from mlflow import MlflowClient
    from mlflow.utils.async_logging.run_operations import RunOperations

# MLflow's default (10 s) leaves a GPU training of a few seconds without a single sample; psutil's
# sampling thread costs well under 1 % of a core at this rate.
SYSTEM_METRICS_INTERVAL_S = 2.0
# Step metrics (log_step_metrics) reach the store this often, and at the end of the stage's work.
METRICS_FLUSH_INTERVAL_S = 10.0
MLFLOW_BATCH_LIMIT = 1000  # metrics per log_batch call


@functools.lru_cache(maxsize=4096)  # a training run's step metrics repeat a handful of names thousands of times
def metric_name(name: str) -> str:
    """MLflow accepts letters, digits and `_ - . / space` in metric names; replace the rest."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


@dataclass
class Tracker:
    """One stage run: an MLflow run and a TensorBoard run folder, logged to together.

    Stages log only through these methods. Scalars, text, images and HParams go through a torch-free event
    writer; only the graph uses torch's tracer, imported when a stage draws one.
    """

    client: MlflowClient
    run_id: str
    events: EventWriter
    experiment_id: str = ""
    machine_id: str = ""  # the `machine.id` tag of this run
    parent_run_id: str = ""  # the `pipeline@...` run this stage's run is a child of
    uri: str = ""  # the tracking store's, without credentials
    root: Path = Path()  # the project folder (its outputs' paths are relative to it)
    workspace: str = ""  # the `dvc.workspace` tag: the folder the stage writes its outputs in
    tensorboard_dir: Path | None = None  # `tracking.tensorboard_dir`, resolved: every run folder is below it
    flush_interval_s: float = METRICS_FLUSH_INTERVAL_S
    _pending: list[tuple[str, float, int, int]] = dataclasses.field(default_factory=list)
    _operations: list[RunOperations] = dataclasses.field(default_factory=list)
    _last_flush: float = dataclasses.field(default_factory=time.monotonic)

    def close(self) -> None:
        self.events.close()  # after flush(): open_tracker flushes first

    def log_params(self, params: Mapping[str, Any], prefix: str = "") -> None:
        """MLflow params (write-once per run), each key prefixed with `prefix` (e.g. `graph.`)."""
        from mlflow.entities import Param

        # Values pass through `redact`: a URL with a password must not become a stored param.
        entries = [Param(f"{prefix}{key}", redact(str(value))) for key, value in params.items()]
        self.client.log_batch(self.run_id, params=entries)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])

    def log_metrics(
        self,
        metrics: Mapping[str, float],
        step: int = 0,
        prefix: str = "",
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """One batched MLflow call (~0.1 ms a metric) plus TensorBoard scalars, all at `step`.

        `prefix` (`profile/`, `train/`, ...) groups a stage's metrics: MLflow's charts and TensorBoard's
        scalars are sectioned by the part before the first `/`. With `model_id` (a logged model of this run) and
        `dataset` (the (name, digest) of a dataset logged as this run's input), MLflow also lists the values on
        that model's page, on the row of that dataset (MLflow 3's model metrics).
        """
        timestamp = int(time.time() * 1000)
        entries = [(prefix + key, float(value), timestamp, step) for key, value in metrics.items()]
        self._write(entries, wait=True, model_id=model_id, dataset=dataset)

    def log_summary(self, metrics: Mapping[str, float], prefix: str) -> None:
        """Numbers that describe the run as a whole, one value each: MLflow metrics (Compare lines runs up by
        them), and in TensorBoard one table in the Text tab (`<prefix>metrics`: `graph/summary` is the model's)
        instead of a single-point card each in Scalars, where dozens of them buried the curves. HParams
        shows the `hparam/*` results."""
        timestamp = int(time.time() * 1000)
        entries = [(prefix + key, float(value), timestamp, 0) for key, value in metrics.items()]
        self._write(entries, wait=True, tensorboard=False)
        rows = [f"| `{key}` | {value:.6g} |" for key, value, _, _ in entries]
        self.events.add_text(f"{prefix}metrics", "\n".join(["| metric | value |", "| --- | ---: |", *rows]), 0)

    def log_step_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Metrics of a training loop's step, kept off the step's path: held in memory and handed to MLflow's
        asynchronous logging (its own thread writes them) and TensorBoard every `flush_interval_s`, so that
        logging costs a loop on a GPU next to nothing (a store call is ~6 ms on SQLite and ~180 ms over HTTP;
        `python -m benchmarks.logging_cost` measures what is left). `flush()` waits until the store has them."""
        timestamp = int(time.time() * 1000)
        self._pending.extend((key, float(value), timestamp, step) for key, value in metrics.items())
        if time.monotonic() - self._last_flush >= self.flush_interval_s:
            self._send_pending()

    def _send_pending(self, wait: bool = False) -> None:
        pending, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        self._write(pending, wait=wait)
        self.events.flush()  # TensorBoard shows training as it goes, a window every `flush_interval_s`

    def _write(
        self,
        entries: Sequence[tuple[str, float, int, int]],
        wait: bool,
        tensorboard: bool = True,
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """(tag, value, timestamp ms, step) entries to MLflow, in batches of its limit, and to TensorBoard (as
        scalars, unless not `tensorboard`). `wait`: the store has them on return; otherwise MLflow's async logging
        writes them and flush() waits. `model_id` and `dataset`: as in `log_metrics`."""
        from mlflow.entities import Metric

        name, digest = dataset or (None, None)
        for start in range(0, len(entries), MLFLOW_BATCH_LIMIT):
            chunk = entries[start : start + MLFLOW_BATCH_LIMIT]
            metrics = [
                Metric(metric_name(key), value, timestamp, step, model_id, dataset_name=name, dataset_digest=digest)
                for key, value, timestamp, step in chunk
            ]
            operation = self.client.log_batch(self.run_id, metrics=metrics, synchronous=wait)
            if operation is not None:
                self._operations.append(operation)
        for key, value, _, step in entries if tensorboard else ():
            self.events.add_scalar(key, value, step)

    def flush(self) -> None:
        """Send the buffered step metrics and wait until the store has them: a store error surfaces here.

        What is still buffered goes synchronously, in this thread: the caller waits for it anyway, and one
        writer costs SQLite about half of what MLflow's pool of asynchronous writers does per metric
        (`python -m benchmarks.logging_cost`)."""
        operations, self._operations = self._operations, []
        for operation in operations:
            operation.wait()  # type: ignore[no-untyped-call]
        self._send_pending(wait=True)
        self.events.flush()  # TensorBoard's buffered events on disk too: a full disk surfaces here, not at close

    def before_commit(self, staged: Mapping[Path, Path]) -> None:
        """Run by AtomicOutputs just before the stage's outputs move into place: what the stage logged reaches the
        store and the disk, and the run records the md5 of every output it is about to write (`dvc.outs.md5`,
        merged over a stage's commits), by which a later stage finds it (lineage.producer_run)."""
        self.flush()
        if staged:
            recorded = json.loads(self.client.get_run(self.run_id).data.tags.get(OUTPUTS_MD5_TAG, "{}"))
            recorded |= json.loads(outputs_md5(staged, self.root))
            self.set_tags({OUTPUTS_MD5_TAG: json.dumps(recorded, sort_keys=True, separators=(",", ":"))})

    def log_curve(self, tag: str, values: Sequence[float]) -> None:
        """A curve at steps 0..n-1 in TensorBoard only. In MLflow a per-step series shows in the run overview
        and Compare as its last value, beside the run's summary statistics, where it reads like one more
        statistic; its values belong in an artifact (the profile record holds them)."""
        for index, value in enumerate(values):
            self.events.add_scalar(tag, value, index)

    def log_image(self, tag: str, image: np.ndarray, artifact_file: str) -> None:
        """`image` is HWC uint8: a PNG artifact in MLflow, an image in TensorBoard; torch-free (PIL encodes the
        PNG, as MLflow and torch's summary code both do), so the download stage never imports torch (3 s)."""
        from PIL import Image  # lazy: only stages that log images

        self.client.log_image(self.run_id, image, artifact_file=artifact_file)
        png = io.BytesIO()
        Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image).save(png, format="PNG")
        self.events.add_png(tag, png.getvalue())

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_hparams(self, hparams: Mapping[str, HParam], metrics: Mapping[str, float]) -> None:
        """A row of TensorBoard's HParams table: this run's `hparams` (names as in pipeline.tracking.hparams) and
        its `metrics` (`hparam/*` scalars, which the table reads), in this run's own folder (SummaryWriter's
        add_hparams would open a sub-folder, making one stage run look like two); the table's columns for the whole
        log directory in its `hparams/` folder (pipeline.tracking.hparams)."""
        for summary in hparams_session(hparams):
            self.events.add_summary(summary)
        for key, value in metrics.items():
            self.events.add_scalar(key, value, 0)
        if self.tensorboard_dir is not None:
            write_experiment(self.tensorboard_dir)

    def add_graph(self, model: torch.nn.Module, example: torch.Tensor) -> None:
        """TensorBoard's Graphs tab (traced with torch.jit.trace; model and example on one device).

        torch's tracer builds the graph (what SummaryWriter.add_graph writes), and this run's own event writer
        writes it, on this thread: SummaryWriter's writer thread printed its own traceback when the disk was
        full and failed the stage later, or not at all, with an error about the tracer."""
        from torch.utils.tensorboard._pytorch_graph import graph  # lazy: only export_graph draws a graph

        graph_def, step_stats = graph(model, example)  # type: ignore[no-untyped-call]
        self.events.add_graph(graph_def.SerializeToString(), step_stats.SerializeToString())

    def log_text(self, tag: str, markdown: str, artifact_file: str | None = None) -> None:
        """Markdown in TensorBoard's Text tab and, with `artifact_file`, as an MLflow artifact."""
        if artifact_file is not None:
            self.client.log_text(self.run_id, markdown, artifact_file)
        self.events.add_text(tag, markdown, 0)

    def log_artifact_text(self, text: str, artifact_file: str) -> None:
        """A text artifact in MLflow only (e.g. an HTML page TensorBoard would show as source)."""
        self.client.log_text(self.run_id, text, artifact_file)

    def log_png_file(self, tag: str, path: Path) -> None:
        """A PNG file in TensorBoard's Images tab under `tag`, torch-free (the report stage never imports torch).
        TensorBoard only: log the file to MLflow with `log_artifact`."""
        self.events.add_png(tag, path.read_bytes())

    def view_hint(self, whole_experiment: bool = True) -> str:
        """Where to see this run (or its experiment's runs) in MLflow's UI, in its model-training view."""
        return view_hint(self.uri, self.experiment_id, None if whole_experiment else self.run_id)

    def link_training(self, model_digest: str) -> str | None:
        """Point this run at the train run that wrote the checkpoint `model_digest` names and at the model it
        logged: tags `train.run_id`, `model.id`, `model.uri`, and the model as an input of this run (MLflow
        lists it under the run's logged models). Returns the train run's id; None (and no tags) when this
        store holds no such run, e.g. a checkpoint pulled from a DVC remote that another store tracked."""
        from mlflow.entities import LoggedModelInput

        train = training_run(self.client, self.experiment_id, model_digest)
        if train is None:
            return None
        tags = {TRAIN_RUN_TAG: train.info.run_id}
        model_id = train.data.tags.get(MODEL_ID_TAG)
        if model_id:
            tags |= {MODEL_ID_TAG: model_id, MODEL_URI_TAG: f"models:/{model_id}"}
            self.client.log_inputs(self.run_id, models=[LoggedModelInput(model_id)])
        self.set_tags(tags)
        return str(train.info.run_id)

    def link_inputs(self, read: Mapping[str, Path], description: str) -> dict[str, str]:
        """Record which runs produced the outputs this stage read, `read` = {stage run name: a file of its outputs
        this stage read}: a tag `input.<run name>` = run id (`@` → `.`) for each one this store holds (the run
        that wrote those very bytes: lineage.producer_run), and the run's description `description` followed by
        links to them. Returns {run name: run id}."""
        found = {}
        for name, path in read.items():
            run = producer_run(self.client, self.experiment_id, name, path, self.root, self.workspace)
            if run is not None:
                found[name] = str(run.info.run_id)
        links = ", ".join(f"[{name}]({ui_url('', self.experiment_id, run_id)})" for name, run_id in found.items())
        missing = [name for name in read if name not in found]
        note = f"{description}\n\nBuilt from the runs {links}." if found else description
        if missing:
            note += f" Not in this store (outputs from a DVC remote or cache): {', '.join(missing)}."
        # Tag keys take no `@`: `input.profile.64-cpu-train` names the run `profile@64-cpu-train`.
        inputs = {f"{INPUT_TAG_PREFIX}{name.replace('@', '.')}": run_id for name, run_id in found.items()}
        self.set_tags({**inputs, NOTE_TAG: note})
        return found


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
        uri, config.experiment, root, stage, run_name, machine, system_metrics, workspace
    )
    folder = f"{variant + '-' if variant else ''}{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:8]}"
    tensorboard_dir = Path(config.tensorboard_dir)
    tensorboard_dir = tensorboard_dir if tensorboard_dir.is_absolute() else root / tensorboard_dir
    tracker = Tracker(
        client=client,
        run_id=run_id,
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
        with cleanup:
            _clean_up(tracker, uri, run_name, status, failure)


# The store's whole retry budget (store.HTTP_CLIENT_DEFAULTS: about a minute) is for riding out an outage while the
# stage works. Once a call has spent it, or the user stopped the stage, each cleanup call gets one try with a short
# timeout: a dead server would otherwise cost the budget again per call (flush, end the run, the parent), minutes
# before the stage exits. A run it cannot end stays RUNNING until the next stage on this machine marks it FAILED.
ONE_TRY = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


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


def _clean_up(tracker: Tracker, uri: str, run_name: str, status: str, failure: PipelineError | None) -> None:
    """What `stage_run` does however the stage ended: what the store still takes, the event file, the run's end."""
    import mlflow

    if tracker._pending or tracker._operations:  # interrupted or failed: keep what the store still takes
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
    _end_run(tracker, uri, run_name, status, failure)
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
) -> tuple[MlflowClient, str, str, str]:
    """The stage's run started (the active fluent run) under its pipeline parent: (client, experiment id, run id,
    parent run id).
    A store that fails here stops the stage before any work."""
    import mlflow
    from mlflow import MlflowClient
    from sqlalchemy.exc import SQLAlchemyError  # lazy: MLflow's

    try:
        experiment_id = prepare_experiment(uri, experiment, root)
        client = MlflowClient(uri)
        check_artifact_folder(client.get_experiment(experiment_id).artifact_location)
        mark_stale_runs(client, experiment_id)
        mlflow.set_tracking_uri(uri)
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
        parent = parent_run_id(client, experiment_id, pipeline, _dvc_experiment_tags())
        if system_metrics:
            # Its start/stop/"skip GPU" INFO lines would join every training's console output; failures
            # are warnings and still show.
            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            if not os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"):
                mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_INTERVAL_S)  # type: ignore[no-untyped-call]
        run = mlflow.start_run(
            experiment_id=experiment_id,
            run_name=run_name,
            tags=tags,
            parent_run_id=parent,
            log_system_metrics=system_metrics,
        )
    except (mlflow.exceptions.MlflowException, SQLAlchemyError) as error:
        raise PipelineError(
            redact(
                f"MLflow tracking store {uri} failed before the stage started: {_first_line(error)}. Check "
                "$MLFLOW_TRACKING_URI (unset it to use the project's own mlflow.db) and `tracking.experiment` in "
                "params.yaml. Nothing was run."
            )
        ) from None
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


def _end_run(tracker: Tracker, uri: str, run_name: str, status: str, failure: PipelineError | None) -> None:
    """End the run with `status`; a FINISHED run becomes the workspace's current one for its stage. A store
    that fails here adds that to `failure`, or fails a stage that had finished."""
    import mlflow

    try:
        if status == "FINISHED":
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
