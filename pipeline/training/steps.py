"""The step a profile times, shared by the eager profile and its CUDA-graph replay."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def inference_step(model: nn.Module, images: torch.Tensor) -> Callable[[], None]:
    """One forward pass in eval mode without autograd (eager or captured: it holds no state to update)."""
    model.eval()

    def step() -> None:
        with torch.inference_mode():
            model(images)

    return step
