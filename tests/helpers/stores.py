"""An empty MLflow store for a test that needs one but does not test its creation: MLflow migrates a new SQLite
store through every Alembic revision, 0.6-1.3 s of CPU each time, so a test gets a copy of one store that MLflow
created and migrated once per process. The pipeline creates its stores itself wherever a test runs a stage in a
fresh project, so creation stays tested."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

STORE_NAME = "mlflow.db"  # the project's default store, `sqlite:///<project>/mlflow.db`


def empty_store(folder: Path) -> str:
    """`folder`/mlflow.db as MLflow creates it (its schema, the Default experiment, no runs); its `sqlite:///` URI."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_created_store(), folder / STORE_NAME)
    return f"sqlite:///{folder / STORE_NAME}"


@functools.cache
def _created_store() -> Path:
    """A store MLflow created, in a folder removed when this process exits."""
    from mlflow import MlflowClient

    folder = tempfile.mkdtemp(prefix="mlflow-store-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / STORE_NAME
    MlflowClient(f"sqlite:///{path}").search_experiments()  # creates and migrates it
    return path
