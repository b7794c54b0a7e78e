"""Self-describing checkpoints: weights plus everything needed to rebuild and trust them.

Only tensors, dicts, lists, strings and numbers go in, so `torch.load(weights_only=True)` (no
arbitrary unpickling) reads them, and a later stage rebuilds the model from the file alone.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import PipelineError
from pipeline.model import LabNet

CHECKPOINT_FORMAT = 1


def checkpoint_payload(model: LabNet, train_params: dict[str, Any], data_digest: str, runtime: dict[str, Any], metrics: dict[str, float]) -> dict[str, Any]:
    # Weights always saved from CPU and in the default layout, so the bytes do not depend on
    # the training device or memory format.
    state = {name: tensor.detach().to("cpu").contiguous() for name, tensor in model.state_dict().items()}
    return {
        "format": CHECKPOINT_FORMAT,
        "state_dict": state,
        "model": model.describe(),
        "train_params": train_params,
        "data_digest": data_digest,
        "runtime": runtime,
        "metrics": metrics,
        "torch_version": str(torch.__version__),  # TorchVersion would need an unpickling allow-list
    }


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    torch.save(payload, path)


def checkpoint_digest(path: Path) -> str:
    """SHA-256 of the checkpoint file: the model's identity across machines (tag `model.digest`).

    The bytes are reproducible for the same params, data and CPU, and identical wherever the file
    came from through `dvc pull`, so equal digests mean the very same weights were profiled.
    """
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    model: LabNet  # in eval mode, on the CPU
    data_digest: str
    train_params: dict[str, Any]
    metrics: dict[str, float]


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint written by the train stage; clear error when missing or not ours."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing: run the train stage first (`dvc repro train`).") from None
    except (RuntimeError, zipfile.BadZipFile, EOFError) as error:
        raise PipelineError(f"{path} is not a readable checkpoint ({error}); rerun `dvc repro -f train`.") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise PipelineError(
            f"{path} is not a checkpoint of format {CHECKPOINT_FORMAT} written by this pipeline's train stage; "
            "rerun `dvc repro -f train`."
        )
    model = LabNet.from_description(payload["model"])
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return Checkpoint(model=model, data_digest=payload["data_digest"], train_params=payload["train_params"], metrics=payload["metrics"])
