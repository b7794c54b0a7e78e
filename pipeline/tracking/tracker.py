"""The facade every stage logs through: one stage run's MLflow run and TensorBoard run folder, logged to together.

Where things go by default (so `mlflow ui` and `tensorboard --logdir runs` in the project root see
every run, including those of queued `dvc exp run` copies under .dvc/tmp/exps):

    <project>/mlflow.db       MLflow tracking store (SQLite); $MLFLOW_TRACKING_URI overrides it
    <project>/mlartifacts/    MLflow artifacts of that store
    <project>/runs/<stage>/<time>-<run id>/   TensorBoard, one folder per stage run

pipeline.tracking.lifecycle opens one (`open_tracker`) and ends its run however the stage ends.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.tracking.hparams import write_experiment
from pipeline.tracking.lineage import outputs_md5, producer_run, training_run
from pipeline.tracking.mlflow_run import MlflowRun
from pipeline.tracking.store import ui_url, view_hint
from pipeline.tracking.tags import (
    INPUT_TAG_PREFIX,
    MODEL_ID_TAG,
    MODEL_URI_TAG,
    NOTE_TAG,
    OUTPUTS_MD5_TAG,
    TRAIN_RUN_TAG,
)
from pipeline.tracking.tensorboard_events import EventWriter, HParam, hparams_session

if TYPE_CHECKING:  # imported lazily at run time: `import mlflow` alone takes seconds
    import numpy as np
    import torch
    from mlflow import MlflowClient

# Step metrics (log_step_metrics) reach the store this often, and at the end of the stage's work.
METRICS_FLUSH_INTERVAL_S = 10.0


@dataclass
class Tracker:
    """One stage run: an MLflow run and a TensorBoard run folder, logged to together.

    Stages log only through these methods; each sends its record to both backends, the MLflow run
    (pipeline.tracking.mlflow_run) and the TensorBoard event writer (pipeline.tracking.tensorboard_events), or
    to the one the record belongs in. Starting and ending the run is pipeline.tracking.lifecycle's. Scalars,
    text, images and HParams are torch-free; only the graph uses torch's tracer, imported when a stage draws one.
    """

    mlflow: MlflowRun
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
    _last_flush: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def client(self) -> MlflowClient:
        return self.mlflow.client

    @property
    def run_id(self) -> str:
        return self.mlflow.run_id

    @property
    def unsent(self) -> bool:
        """Step metrics not yet handed to the store, or handed and not yet known to be stored."""
        return bool(self._pending) or self.mlflow.unsent

    def close(self) -> None:
        self.events.close()  # after flush(): open_tracker flushes first

    def log_params(self, params: Mapping[str, Any], prefix: str = "") -> None:
        """MLflow params (write-once per run), each key prefixed with `prefix` (e.g. `graph.`)."""
        self.mlflow.log_params({f"{prefix}{key}": value for key, value in params.items()})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.mlflow.set_tags(tags)

    def log_metrics(
        self,
        metrics: Mapping[str, float],
        step: int = 0,
        prefix: str = "",
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """One batched MLflow call plus TensorBoard scalars, all at `step`.

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
        logging costs a loop on a GPU next to nothing (a store call takes milliseconds on SQLite and far longer over
        HTTP: docs/measurements.md; `python -m benchmarks.logging_cost` measures what is left). `flush()` waits until
        the store has them."""
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
        """(tag, value, timestamp ms, step) entries to MLflow and to TensorBoard (as scalars, unless not
        `tensorboard`). `wait`: the store has them on return; otherwise flush() waits. `model_id` and `dataset`: as
        in `log_metrics`."""
        self.mlflow.log_metrics(entries, wait, model_id, dataset)
        for key, value, _, step in entries if tensorboard else ():
            self.events.add_scalar(key, value, step)

    def flush(self) -> None:
        """Send the buffered step metrics and wait until the store has them: a store error surfaces here.

        What is still buffered goes synchronously, in this thread: the caller waits for it anyway, and one
        writer costs SQLite about half of what MLflow's pool of asynchronous writers does per metric
        (`python -m benchmarks.logging_cost`)."""
        self.mlflow.wait()
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
        PNG, as MLflow and torch's summary code both do), so the download stage never imports torch (seconds)."""
        from PIL import Image  # lazy: only stages that log images

        self.mlflow.log_image(image, artifact_file)
        png = io.BytesIO()
        Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image).save(png, format="PNG")
        self.events.add_png(tag, png.getvalue())

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.mlflow.log_artifact(path, artifact_path)

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
            self.mlflow.log_text(markdown, artifact_file)
        self.events.add_text(tag, markdown, 0)

    def log_artifact_text(self, text: str, artifact_file: str) -> None:
        """A text artifact in MLflow only (e.g. an HTML page TensorBoard would show as source)."""
        self.mlflow.log_text(text, artifact_file)

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
