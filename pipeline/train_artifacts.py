"""What the train stage writes (metrics and plot files for DVC) and logs (MLflow, TensorBoard)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from pipeline.model import LabNet
from pipeline.tracking import Tracker
from pipeline.training import TrainingResult

# Batch of the MLflow input example: > 1 so the exported model keeps a dynamic batch dimension.
EXAMPLE_BATCH = 2


def quality_metrics(result: TrainingResult) -> dict[str, float]:
    """Deterministic numbers for `metrics/train.json`: identical for identical params, data, machine."""
    last = result.epochs[-1]
    return {
        "test_accuracy": last.test_accuracy,
        "test_loss": last.test_loss,
        "train_accuracy": last.train_accuracy,
        "train_loss": last.train_loss,
        "epochs": len(result.epochs),
        "steps": result.optimizer_steps,
    }


def speed_metrics(result: TrainingResult) -> dict[str, float]:
    """Wall-clock numbers, kept apart from `quality_metrics` because they differ run to run."""
    return {
        "train_seconds": round(result.train_seconds, 3),
        "images_per_second": round(result.images_per_second, 1),
    }


def log_training_setup(
    tracker: Tracker,
    train_params: Mapping[str, Any],
    runtime: Mapping[str, Any],
    hardware: Mapping[str, str],
    data_digest: str,
) -> None:
    tracker.log_params({f"train.{key}": value for key, value in train_params.items()})
    tracker.log_params({f"runtime.{key}": value for key, value in runtime.items()})
    tracker.set_tags({"data.digest": data_digest, **{f"hardware.{key}": value for key, value in hardware.items()}})


def log_training_result(tracker: Tracker, result: TrainingResult, train_params: Mapping[str, Any]) -> None:
    final = quality_metrics(result)
    tracker.log_metrics({**{f"final/{k}": v for k, v in final.items()}, **speed_metrics(result)}, step=len(result.epochs))
    tracker.log_hparams(
        {key: value for key, value in train_params.items() if isinstance(value, (int, float, str, bool))},
        {"hparam/test_accuracy": final["test_accuracy"], "hparam/test_loss": final["test_loss"]},
    )


def log_model(tracker: Tracker, model: LabNet) -> None:
    """Log the model in MLflow's default torch.export format, with a dynamic batch dimension."""
    import mlflow

    cpu_model = LabNet.from_description(model.describe())
    cpu_model.load_state_dict({name: tensor.cpu() for name, tensor in model.state_dict().items()})
    cpu_model.eval()
    example = np.zeros((EXAMPLE_BATCH, *cpu_model.input_shape), dtype=np.float32)
    mlflow.pytorch.log_model(
        cpu_model,
        name="model",
        input_example=example,
        # Pinned here: inferring requirements would import the model in a subprocess (slow).
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
    )
