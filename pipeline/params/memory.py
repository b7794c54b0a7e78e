"""Will it fit? Memory for the model and batches, room and write access for the outputs — checked up front.

Without these checks an absurd `train.model.hidden_units` ends in an allocation traceback (or the
OOM killer), and a full or read-only output folder is found only after the whole training. The
estimates are deliberately simple upper-bound arithmetic (no torch import: the validate stage uses
them in a fraction of a second); they refuse what surely cannot fit, not what merely might not.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.dataset import CLASSES, IMAGE_HEIGHT, IMAGE_SHAPE, IMAGE_WIDTH, SPLIT_IMAGES
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import size_text
from pipeline.params.schema import ModelConfig, Params

FLOAT_BYTES = 4  # fp32 weights and activations
MNIST_TRAIN_IMAGES = SPLIT_IMAGES["train"]
MNIST_TEST_IMAGES = SPLIT_IMAGES["test"]
# Parameter, gradient and Adadelta's two running averages: four fp32 copies of every weight.
TRAINING_COPIES = 4


def parameter_count(model: ModelConfig, input_shape: tuple[int, int, int] = IMAGE_SHAPE) -> int:
    """Weights of pipeline.model.LabNet for `model` (tests check it against the real network)."""
    channels, height, width = input_shape
    pooled = model.conv2_channels * ((height - 4) // 2) * ((width - 4) // 2)  # two 3x3 convs, then max-pool 2
    return (
        (channels * 9 + 1) * model.conv1_channels
        + (model.conv1_channels * 9 + 1) * model.conv2_channels
        + (pooled + 1) * model.hidden_units
        + (model.hidden_units + 1) * CLASSES
    )


def activation_bytes_per_sample(
    model: ModelConfig, training: bool = True, input_shape: tuple[int, int, int] = IMAGE_SHAPE
) -> int:
    """Tensors one sample keeps alive. Training: every layer's output, saved for backward, and as much
    again for the gradients flowing back (max-pool indices are int64: two floats). Inference (no
    grad): at most a layer's input and output at once, the widest being around conv2."""
    _, height, width = input_shape
    conv1 = model.conv1_channels * (height - 2) * (width - 2)
    conv2 = model.conv2_channels * (height - 4) * (width - 4)
    pooled = model.conv2_channels * ((height - 4) // 2) * ((width - 4) // 2)
    if not training:
        return FLOAT_BYTES * max(conv1 + 2 * conv2, pooled + 2 * model.hidden_units)
    floats = 2 * conv1 + 2 * conv2 + 5 * pooled + 3 * model.hidden_units + 2 * CLASSES
    return 2 * FLOAT_BYTES * floats


def memory_limit_bytes() -> int | None:
    """Physical memory, or the container's cgroup limit when lower; None where neither is known."""
    limits = []
    with contextlib.suppress(ValueError, OSError, AttributeError):  # sysconf names differ per platform
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for cgroup_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(cgroup_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" or a huge number mean no limit
            limits.append(int(text))
    return min(limits) if limits else None


@dataclass(frozen=True)
class MemoryNeed:
    key: str  # the params key that drives it
    what: str
    bytes: int


def training_memory(params: Params) -> list[MemoryNeed]:
    train = params.train
    samples = min(train.train_samples or MNIST_TRAIN_IMAGES, MNIST_TRAIN_IMAGES)
    per_sample = activation_bytes_per_sample(train.model)
    return [
        MemoryNeed(
            "train.model",
            "weights, gradients and optimizer state",
            TRAINING_COPIES * FLOAT_BYTES * parameter_count(train.model),
        ),
        MemoryNeed(
            "train.batch_size", "activations of one training batch", min(train.batch_size, samples) * per_sample
        ),
        MemoryNeed(
            "train.test_batch_size",
            "activations of one test batch",
            min(train.test_batch_size, MNIST_TEST_IMAGES) * activation_bytes_per_sample(train.model, training=False),
        ),
        MemoryNeed(
            "train.train_samples",
            "the data set as normalized float tensors",
            (samples + MNIST_TEST_IMAGES) * IMAGE_HEIGHT * IMAGE_WIDTH * FLOAT_BYTES,
        ),
    ]


def profile_memory(params: Params) -> list[MemoryNeed]:
    """The largest profiled batch (the model is the checkpoint's, made from train.model)."""
    model = params.train.model
    training = "train" in params.profile.modes
    per_sample = activation_bytes_per_sample(model, training=training)
    return [
        MemoryNeed(
            "train.model",
            "weights, gradients and optimizer state",
            TRAINING_COPIES * FLOAT_BYTES * parameter_count(model),
        ),
        MemoryNeed(
            "profile.batch_sizes",
            "activations of the largest profiled batch",
            max(params.profile.batch_sizes) * per_sample,
        ),
    ]


def check_params_fit_memory(params: Params, source: str = "params.yaml", limit: int | None = None) -> None:
    """Refuse params whose training or profiling surely cannot fit in this machine's memory."""
    limit = memory_limit_bytes() if limit is None else limit
    if limit is None:
        return
    for stage, needs in (("train", training_memory(params)), ("profile", profile_memory(params))):
        total = sum(need.bytes for need in needs)
        if total > limit:
            largest = max(needs, key=lambda need: need.bytes)
            parts = "; ".join(f"{need.what} `{need.key}` ≈ {size_text(need.bytes)}" for need in needs)
            raise PipelineError(
                f"{source} asks the {stage} stage for about {size_text(total)} of memory but this machine has "
                f"{size_text(limit)} ({parts}). Lower `{largest.key}` in {source} (the largest part) and run again."
            )


def check_model_fits_memory(model: ModelConfig, what: str, fix: str, limit: int | None = None) -> None:
    """For a checkpoint's model config: refuse one whose weights alone cannot fit (before building it)."""
    limit = memory_limit_bytes() if limit is None else limit
    need = FLOAT_BYTES * parameter_count(model)
    if limit is not None and need > limit:
        raise PipelineError(
            f"{what} describes a network of {parameter_count(model):,} weights ({size_text(need)}), more than this "
            f"machine's {size_text(limit)} of memory; it was not built. {fix}"
        )
