"""What the download stage logs: dataset digests, sizes and counts, MLflow dataset inputs, a sample grid."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from pipeline.config import DataConfig, section_as_dict
from pipeline.data import SPLIT_PREFIX, DownloadResult, dataset_digest
from pipeline.tracking import Tracker

if TYPE_CHECKING:
    from mlflow.data.dataset_source import DatasetSource

CLASSES = 10
GRID_PADDING = 2  # pixels between digits, so neighbours don't merge into one blob
MLFLOW_DIGEST_LENGTH = 32  # MLflow stores dataset digests in a 36-character column


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
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.types import Schema, TensorSpec

    tracker.log_params({f"data.{key}": value for key, value in section_as_dict(config).items()})
    tracker.log_params({f"source.{f.name}": f.source for f in result.files})
    tracker.set_tags({"data.digest": result.dataset_digest})

    metrics: dict[str, float] = {}
    for split, prefix in SPLIT_PREFIX.items():
        images_file = result.file(f"{prefix}-images-idx3-ubyte")
        labels_file = result.file(f"{prefix}-labels-idx1-ubyte")
        images, _labels = result.split(split)  # type: ignore[arg-type]
        metrics[f"{split}_samples"] = images.shape[0]
        metrics[f"{split}_bytes"] = len(images_file.content) + len(labels_file.content)
        split_digest = dataset_digest({f.name: f.sha256 for f in (images_file, labels_file)})
        dataset = MetaDataset(  # type: ignore[abstract]  # concrete at run time; MLflow's annotation is off
            source=_dataset_source(images_file.source),
            name=f"mnist-{split}",
            digest=split_digest[:MLFLOW_DIGEST_LENGTH],
            schema=Schema(
                [
                    TensorSpec(np.dtype(np.uint8), (-1, *images.shape[1:]), "image"),
                    TensorSpec(np.dtype(np.uint8), (-1,), "label"),
                ]
            ),
        )
        mlflow.log_input(dataset, context="training" if split == "train" else "testing")
    tracker.log_metrics(metrics)

    train_images, train_labels = result.split("train")
    grid = sample_grid(train_images, train_labels, config.samples_per_class)
    tracker.log_image("mnist/train_samples_by_class", grid, "samples_by_class.png")


def _dataset_source(location: str) -> DatasetSource:
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():
        # MLflow registers two equivalent local-file source classes and warns that it picked one.
        warnings.filterwarnings("ignore", message=".*can be interpreted in multiple ways.*")
        return resolve_dataset_source(location)
