"""Will it fit? Memory for the model and batches, room and write access for the outputs — checked up front.

Without these checks an absurd `train.model.hidden_units` ends in an allocation traceback (or the
OOM killer), and a full or read-only output folder is found only after the whole training. The
estimates are deliberately simple upper-bound arithmetic (no torch import: the validate stage uses
them in a fraction of a second); they refuse what surely cannot fit, not what merely might not.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import ModelConfig, Params
from pipeline.errors import PipelineError

FLOAT_BYTES = 4  # fp32 weights and activations
MNIST_IMAGE_SHAPE = (1, 28, 28)
MNIST_CLASSES = 10
MNIST_TRAIN_IMAGES = 60_000
MNIST_TEST_IMAGES = 10_000
# Parameter, gradient and Adadelta's two running averages: four fp32 copies of every weight.
TRAINING_COPIES = 4
# Below this much free space a stage does not start: every output of one stage is smaller (the data
# set, the largest, is ~55 MB), and a nearly full disk fails halfway otherwise.
MIN_FREE_BYTES = 64 << 20


def parameter_count(model: ModelConfig, input_shape: tuple[int, int, int] = MNIST_IMAGE_SHAPE) -> int:
    """Weights of pipeline.model.LabNet for `model` (tests check it against the real network)."""
    channels, height, width = input_shape
    pooled = model.conv2_channels * ((height - 4) // 2) * ((width - 4) // 2)  # two 3x3 convs, then max-pool 2
    return (
        (channels * 9 + 1) * model.conv1_channels
        + (model.conv1_channels * 9 + 1) * model.conv2_channels
        + (pooled + 1) * model.hidden_units
        + (model.hidden_units + 1) * MNIST_CLASSES
    )


def activation_bytes_per_sample(
    model: ModelConfig, training: bool = True, input_shape: tuple[int, int, int] = MNIST_IMAGE_SHAPE
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
    floats = 2 * conv1 + 2 * conv2 + 5 * pooled + 3 * model.hidden_units + 2 * MNIST_CLASSES
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
            (samples + MNIST_TEST_IMAGES) * 28 * 28 * FLOAT_BYTES,
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
            parts = "; ".join(f"{need.what} `{need.key}` ≈ {_size(need.bytes)}" for need in needs)
            raise PipelineError(
                f"{source} asks the {stage} stage for about {_size(total)} of memory but this machine has "
                f"{_size(limit)} ({parts}). Lower `{largest.key}` in {source} (the largest part) and run again."
            )


def check_model_fits_memory(model: ModelConfig, what: str, fix: str, limit: int | None = None) -> None:
    """For a checkpoint's model config: refuse one whose weights alone cannot fit (before building it)."""
    limit = memory_limit_bytes() if limit is None else limit
    need = FLOAT_BYTES * parameter_count(model)
    if limit is not None and need > limit:
        raise PipelineError(
            f"{what} describes a network of {parameter_count(model):,} weights ({_size(need)}), more than this "
            f"machine's {_size(limit)} of memory; it was not built. {fix}"
        )


def check_output_folder(folder: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """`folder` exists (created if needed), accepts a new file, and has `min_free` bytes free."""
    fix = "Nothing was run."
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise PipelineError(
            f"cannot write into {folder}/ ({error.strerror}): {_access_fix(error, folder)} {fix}"
        ) from None
    free = shutil.disk_usage(folder).free
    if free < min_free:
        raise PipelineError(
            f"{folder}/ has only {_size(free)} free on its file system; this stage needs at least {_size(min_free)} "
            f"there for its outputs. Free space on the file system holding {folder}/ and run again. {fix}"
        )


def write_error_message(error: OSError, path: Path | str | None = None, folders: Sequence[Path] = ()) -> str:
    """One paragraph for an OSError met while writing outputs: which path, what happened, the fix.

    A failed write() names no file; then the `folders` the stage writes into are checked, and the
    full ones named.
    """
    reason = error.strerror or str(error)
    where = path if path is not None else error.filename
    if where is not None:
        return f"could not write {where} ({reason}): {_access_fix(error, Path(str(where)).parent)}"
    full = [(folder, shutil.disk_usage(folder).free) for folder in folders if folder.is_dir()]
    full = [(folder, free) for folder, free in full if free < MIN_FREE_BYTES]
    if full:
        listing = "; ".join(f"{folder}/ has only {_size(free)} free" for folder, free in full)
        return f"could not write ({reason}): {listing}. Free space there and run again."
    shown = ", ".join(f"{folder}/" for folder in folders) or "the output folders"
    return f"could not write an output ({reason}): check free space and permissions of {shown} and run again."


def _access_fix(error: OSError, folder: Path) -> str:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the file system holding {folder}/ is full (or over quota); free space there and run again."
    if error.errno == errno.EROFS:
        return f"{folder}/ is on a read-only file system; remount it writable or run the project elsewhere."
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"make {folder}/ writable for this user (permissions, `chattr -i`) and run again."
    return "check the path and run again."


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} PiB"
