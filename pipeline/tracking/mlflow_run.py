"""The MLflow side of a stage's run: what the Tracker sends, in the calls MLflow's client takes."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.common.credentials import redact

if TYPE_CHECKING:  # imported lazily at run time: `import mlflow` alone takes seconds
    import numpy as np
    from mlflow import MlflowClient
    from mlflow.utils.async_logging.run_operations import RunOperations

MLFLOW_BATCH_LIMIT = 1000  # metrics per log_batch call


@functools.lru_cache(maxsize=4096)  # a training run's step metrics repeat a handful of names thousands of times
def metric_name(name: str) -> str:
    """MLflow accepts letters, digits and `_ - . / space` in metric names; replace the rest."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


@dataclass
class MlflowRun:
    """One MLflow run, written through its client; asynchronous metric batches are kept until `wait`."""

    client: MlflowClient
    run_id: str
    _operations: list[RunOperations] = dataclasses.field(default_factory=list)

    @property
    def unsent(self) -> bool:
        """Metric batches handed to MLflow's asynchronous logging that `wait` has not seen stored yet."""
        return bool(self._operations)

    def log_params(self, params: Mapping[str, object]) -> None:
        """Params (write-once per run); values pass through `redact`: a URL with a password must not be stored."""
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(key, redact(str(value))) for key, value in params.items()])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(key, str(value)) for key, value in tags.items()])

    def log_metrics(
        self,
        entries: Sequence[tuple[str, float, int, int]],
        wait: bool,
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """(tag, value, timestamp ms, step) entries in batches of MLflow's limit. `wait`: stored on return;
        otherwise MLflow's asynchronous logging writes them and `wait()` waits. `model_id` and `dataset`: the
        logged model and the (name, digest) of the input dataset the values belong to (MLflow 3's model metrics)."""
        from mlflow.entities import Metric

        name, digest = dataset or (None, None)
        for start in range(0, len(entries), MLFLOW_BATCH_LIMIT):
            metrics = [
                Metric(metric_name(key), value, timestamp, step, model_id, dataset_name=name, dataset_digest=digest)
                for key, value, timestamp, step in entries[start : start + MLFLOW_BATCH_LIMIT]
            ]
            operation = self.client.log_batch(self.run_id, metrics=metrics, synchronous=wait)
            if operation is not None:
                self._operations.append(operation)

    def wait(self) -> None:
        """Until the store has every asynchronous batch: a store error surfaces here."""
        operations, self._operations = self._operations, []
        for operation in operations:
            operation.wait()  # type: ignore[no-untyped-call]

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_image(self, image: np.ndarray, artifact_file: str) -> None:
        self.client.log_image(self.run_id, image, artifact_file=artifact_file)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)
