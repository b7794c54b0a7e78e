"""What the train stage writes (metrics and plot files for DVC) and logs (MLflow, TensorBoard)."""

from __future__ import annotations

import os
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
    tracker.log_metrics(
        {**{f"final/{k}": v for k, v in final.items()}, **speed_metrics(result)}, step=len(result.epochs)
    )
    tracker.log_hparams(
        {key: value for key, value in train_params.items() if isinstance(value, (int, float, str, bool))},
        {"hparam/test_accuracy": final["test_accuracy"], "hparam/test_loss": final["test_loss"]},
    )


def log_model(tracker: Tracker, model: LabNet) -> None:
    """Log the model in MLflow's default torch.export format, with a dynamic batch dimension.

    An exported program keeps its weights on the device it was exported on, and MLflow's pyfunc loader
    (which also checks the input example while logging) refuses to move them: it loads on
    `serving_device()`. So the model is exported for that device, and loads and predicts on the machine
    that logged it, GPU or not; the checkpoint (weights saved from the CPU) is the portable copy.
    """
    import mlflow

    device = serving_device()
    cpu_model = LabNet.from_description(model.describe())
    cpu_model.load_state_dict({name: tensor.cpu() for name, tensor in model.state_dict().items()})
    cpu_model.eval()
    served: torch.nn.Module = cpu_model if device.type == "cpu" else OnDevice(cpu_model, device).eval()
    example = np.zeros((EXAMPLE_BATCH, *cpu_model.input_shape), dtype=np.float32)
    tracker.set_tags({"model.serving_device": str(device)})
    mlflow.pytorch.log_model(
        served,
        name="model",
        input_example=example,
        # Pinned here: inferring requirements would import the model in a subprocess (slow).
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
    )


def serving_device() -> torch.device:
    """Where MLflow's pyfunc loader puts a PyTorch model on this machine (mlflow.pytorch._load_pyfunc):
    $MLFLOW_DEFAULT_PREDICTION_DEVICE if set, else the default CUDA device if there is one, else the CPU."""
    chosen = os.environ.get("MLFLOW_DEFAULT_PREDICTION_DEVICE")
    if chosen:
        return torch.device(chosen)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class OnDevice(torch.nn.Module):
    """`model` on `device`, taking input on any device and answering on the input's device.

    Exported with MLflow's CPU example, both copies become part of the program: it accepts CPU or
    `device` tensors (MLflow's pyfunc wrapper sends `device` tensors) and answers on the CPU.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model.to(device)
        self.device = device

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # aten._to_copy, not Tensor.to: torch.export guards each `.to` with an assert on its input's device
        # (the CPU of the example), which would refuse the GPU tensors the pyfunc wrapper passes.
        answer: torch.Tensor = self.model(torch.ops.aten._to_copy.default(images, device=self.device))
        on_input_device: torch.Tensor = torch.ops.aten._to_copy.default(answer, device=images.device)
        return on_input_device
