"""MNIST as normalized float tensors on the training device, in the memory layout the convolutions want."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.devices.registry import host_kind

# The lab's normalization constants: mean and std of the MNIST training pixels in [0, 1].
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
# Channels-last: oneDNN's preferred convolution layout on CPU (benchmarks/train_speed.py; README, train).
MEMORY_FORMAT = torch.channels_last


@dataclass(frozen=True)
class DeviceData:
    images: torch.Tensor  # (N, 1, 28, 28) float32, normalized, on the training device
    labels: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return self.labels.shape[0]


CPU = host_kind().torch_device()


def normalize_images(images: np.ndarray, device: torch.device = CPU) -> torch.Tensor:
    """uint8 (N, 28, 28) pixels → float (N, 1, 28, 28) on `device`, normalized as the model expects."""
    pixels = torch.from_numpy(np.array(images, copy=True)).to(device)  # IDX arrays are read-only views
    return pixels.float().div_(255).sub_(MNIST_MEAN).div_(MNIST_STD).unsqueeze(1)


def to_device_data(images: np.ndarray, labels: np.ndarray, device: torch.device) -> DeviceData:
    """uint8 (N, 28, 28) images and labels → normalized tensors on `device` (one host→device copy)."""
    return DeviceData(
        images=normalize_images(images, device).contiguous(memory_format=MEMORY_FORMAT),
        labels=torch.from_numpy(labels.astype(np.int64)).to(device),
    )


def first_samples(
    images: np.ndarray, labels: np.ndarray, count: int, split: str = "train"
) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` samples of `split` (0 = all); asking for more than exist is a user error."""
    if count > len(labels):
        name = "training" if split == "train" else split
        raise PipelineError(
            f"`train.{split}_samples` = {count} but the {name} set has {len(labels)} images. "
            f"Set it to at most {len(labels)}, or 0 for all of them, in params.yaml."
        )
    return (images[:count], labels[:count]) if count else (images, labels)
