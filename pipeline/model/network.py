"""The lab network, and nothing else.

conv 1→32 3×3 → ReLU → conv 32→64 3×3 → ReLU → max-pool 2 → dropout → flatten → fc →128 → ReLU →
dropout → fc →10 → log-softmax (pytorch/examples mnist). Layer widths and dropout come from
`train.model` in params.yaml; the flatten size is derived from the input shape, not hard-coded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict

import torch
from torch import nn

from pipeline.common.dataset import CLASSES, IMAGE_SHAPE
from pipeline.params.schema import ModelConfig


class Dropout(nn.Dropout):
    """nn.Dropout with the keep-mask drawn as `uniform >= p` and applied with `where`.

    Same distribution and the same expectation-preserving scaling as nn.Dropout. On CPU,
    `bernoulli_` (what nn.Dropout uses) draws the mask much slower than `uniform_` and was the
    costliest op of a training step; `where` also beats multiplying by the mask. Together they
    make training measurably faster (docs/measurements.md).
    """

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return inputs
        keep = torch.empty_like(inputs).uniform_() >= self.p
        return torch.where(keep, inputs * (1.0 / (1.0 - self.p)), 0.0)


def _pair(value: int | tuple[int, ...] | str) -> tuple[int, int]:
    """A layer's size attribute as (height, width): an int is both; padding given as a string is not used here."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, str):
        raise TypeError(f"padding {value!r}: LabNet's layers use numeric padding")
    return int(value[0]), int(value[-1])


def _output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """torch.nn.Conv2d's and MaxPool2d's (ceil_mode off) output size along one axis."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


class LabNet(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        input_shape: Sequence[int] = IMAGE_SHAPE,
        classes: int = CLASSES,
    ) -> None:
        super().__init__()
        self.config = config
        self.input_shape = tuple(input_shape)
        channels = self.input_shape[0]
        # Named modules (not a bare Sequential) so graphs and summaries read "conv1", "fc1", ...
        self.features = nn.Sequential(
            OrderedDict(
                conv1=nn.Conv2d(channels, config.conv1_channels, kernel_size=3, stride=1),
                relu1=nn.ReLU(),
                conv2=nn.Conv2d(config.conv1_channels, config.conv2_channels, kernel_size=3, stride=1),
                relu2=nn.ReLU(),
                pool=nn.MaxPool2d(kernel_size=2),
                dropout1=Dropout(
                    config.conv_dropout
                ),  # element-wise, as upstream: Dropout2d on 2-D input is deprecated
            )
        )
        self.classifier = nn.Sequential(
            OrderedDict(
                flatten=nn.Flatten(),
                fc1=nn.Linear(self._flattened_features(), config.hidden_units),
                relu3=nn.ReLU(),
                dropout2=Dropout(config.hidden_dropout),
                fc2=nn.Linear(config.hidden_units, classes),
                log_softmax=nn.LogSoftmax(dim=1),
            )
        )

    def _flattened_features(self) -> int:
        """64 × 12 × 12 = 9216 for the lab's widths on 28×28 input, from the layers' own sizes.

        Arithmetic, not a forward pass: a pass on the meta device (no memory) imports torch._dynamo for its
        shape functions, seconds of every stage's start-up for one number."""
        channels, height, width = self.input_shape
        for layer in self.features:
            if isinstance(layer, nn.Conv2d | nn.MaxPool2d):
                height, width = (
                    _output_size(size, kernel, stride, padding, dilation)
                    for size, kernel, stride, padding, dilation in zip(
                        (height, width),
                        _pair(layer.kernel_size),
                        _pair(layer.stride),
                        _pair(layer.padding),
                        _pair(layer.dilation),
                        strict=True,
                    )
                )
            if isinstance(layer, nn.Conv2d):
                channels = layer.out_channels
        return channels * height * width

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 1, 28, 28) normalized images → (N, 10) log-probabilities."""
        log_probabilities: torch.Tensor = self.classifier(self.features(images))
        return log_probabilities

    def checkpoint_description(self) -> dict[str, object]:
        """What a checkpoint stores to rebuild this network without params.yaml."""
        return {"model_config": asdict(self.config), "input_shape": list(self.input_shape)}

    @classmethod
    def from_description(cls, description: dict[str, object]) -> LabNet:
        return cls(ModelConfig(**description["model_config"]), input_shape=description["input_shape"])  # type: ignore[arg-type]
