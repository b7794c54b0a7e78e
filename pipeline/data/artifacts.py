"""What the download stage logs: dataset digests, sizes and counts, MLflow dataset inputs, a sample grid."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.common.dataset import CLASSES, IMAGE_HEIGHT, IMAGE_WIDTH
from pipeline.data.mnist import DATASET_DIR, RAW_DIR, SPLIT_PREFIX, DownloadResult, Split, dataset_digest
from pipeline.params.schema import DataConfig, section_as_dict
from pipeline.tracking.tags import DATA_DIGEST_TAG
from pipeline.tracking.tracker import Tracker

if TYPE_CHECKING:
    from mlflow.data.dataset_source import DatasetSource
    from mlflow.data.meta_dataset import MetaDataset


GRID_PADDING = 2  # pixels between digits, so neighbours don't merge into one blob
MLFLOW_DIGEST_LENGTH = 32  # MLflow stores dataset digests in a 36-character column
SPLIT_CONTEXT = {"train": "training", "test": "testing"}  # MLflow's input contexts


def sample_grid(images: np.ndarray, labels: np.ndarray, per_class: int) -> np.ndarray:
    """An HWC uint8 image: row c holds the first `per_class` training images of digit c."""
    height, width = images.shape[1:]
    cell_h, cell_w = height + GRID_PADDING, width + GRID_PADDING
    grid = np.zeros((CLASSES * cell_h + GRID_PADDING, per_class * cell_w + GRID_PADDING), dtype=np.uint8)
    for digit in range(CLASSES):
        for column, index in enumerate(np.flatnonzero(labels == digit)[:per_class]):
            top, left = GRID_PADDING + digit * cell_h, GRID_PADDING + column * cell_w
            grid[top : top + height, left : left + width] = images[index]
    return grid[:, :, None]


def log_download(tracker: Tracker, config: DataConfig, result: DownloadResult) -> None:
    import mlflow

    tracker.log_params({f"data.{key}": value for key, value in section_as_dict(config).items()})
    tracker.log_params({f"source.{f.name}": f.source for f in result.files})
    tracker.set_tags({DATA_DIGEST_TAG: result.dataset_digest})

    metrics: dict[str, float] = {}
    for split, prefix in SPLIT_PREFIX.items():
        images_file = result.file(f"{prefix}-images-idx3-ubyte")
        labels_file = result.file(f"{prefix}-labels-idx1-ubyte")
        images, _labels = result.split(split)  # type: ignore[arg-type]
        metrics[f"{split}_samples"] = images.shape[0]
        metrics[f"{split}_bytes"] = len(images_file.content) + len(labels_file.content)
        dataset = split_dataset(
            split,  # type: ignore[arg-type]
            {f.name: f.sha256 for f in (images_file, labels_file)},
            images_file.source,
            images.shape[1:],
        )
        mlflow.log_input(dataset, context=SPLIT_CONTEXT[split])
    tracker.log_summary(metrics, prefix="data/")

    train_images, train_labels = result.split("train")
    grid = sample_grid(train_images, train_labels, config.samples_per_class)
    tracker.log_image("data/train_samples_by_class", grid, "samples_by_class.png")


def split_dataset(
    split: Split, file_digests: Mapping[str, str], source: str, image_shape: Sequence[int]
) -> MetaDataset:
    """One MNIST split as an MLflow dataset: named `mnist-<split>`, identified by the SHA-256 of its two
    files, so the download run (source: the mirror) and the train run (source: data/MNIST) log the same one."""
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import Schema, TensorSpec

    return MetaDataset(  # type: ignore[abstract]  # concrete at run time; MLflow's annotation is off
        source=_dataset_source(source),
        name=f"mnist-{split}",
        digest=dataset_digest(file_digests)[:MLFLOW_DIGEST_LENGTH],
        schema=Schema(
            [
                TensorSpec(np.dtype(np.uint8), (-1, *image_shape), "image"),
                TensorSpec(np.dtype(np.uint8), (-1,), "label"),
            ]
        ),
    )


def log_training_inputs(
    manifest: Mapping[str, Any], root: Path, samples: Mapping[str, int]
) -> dict[str, tuple[str, str]]:
    """The splits the train stage read (from the workspace copy `root`, as the data manifest describes them)
    as inputs of its run, each tagged with the number of samples used; returns each split's (name, digest) as
    MLflow knows it, for metrics that describe that split (Tracker.log_metrics(dataset=...))."""
    import mlflow

    logged: dict[str, tuple[str, str]] = {}

    files: Mapping[str, Mapping[str, Any]] = manifest["files"]
    for split, prefix in SPLIT_PREFIX.items():
        names = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
        file_digests = {name: str(files[name]["sha256"]) for name in names}
        source = str((root / DATASET_DIR / RAW_DIR / names[0]).resolve())
        dataset = split_dataset(split, file_digests, source, (IMAGE_HEIGHT, IMAGE_WIDTH))  # type: ignore[arg-type]
        mlflow.log_input(dataset, context=SPLIT_CONTEXT[split], tags={"samples": str(samples[split])})
        logged[split] = (dataset.name, dataset.digest)
    return logged


def _dataset_source(location: str) -> DatasetSource:
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():
        # MLflow registers two equivalent local-file source classes and warns that it picked one.
        warnings.filterwarnings("ignore", message=".*can be interpreted in multiple ways.*")
        return resolve_dataset_source(location)
