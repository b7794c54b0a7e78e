"""`params.yaml` parsed once into frozen, typed objects, one per stage section.

params.yaml is the only place that holds values: the dataclasses below carry types and allowed
ranges but no defaults, so a key missing from the file is an error, not a silent fallback.
Validation collects every problem and reports them together, each naming the key, the value and
what is allowed, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.common.credentials import has_user_info
from pipeline.devices.registry import device_names

# A device kind's name (pipeline/devices/: one module per kind); `auto` lets the train stage pick one.
Device = str
DeviceChoice = str
ProfileMode = Literal["inference", "train"]
Precision = Literal["auto", "fp32", "bf16"]
Execution = Literal["auto", "eager", "cuda_graph"]
# Languages of the hand-in, each with its message catalogue (pipeline/report/messages/<language>.toml).
Language = Literal["zh", "en"]


def _rule(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    non_empty: bool = False,
    unique: bool = False,
    max_length: int | None = None,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A dataclass field with validation metadata (and deliberately no default)."""
    return field(
        metadata={
            "ge": ge,
            "gt": gt,
            "le": le,
            "non_empty": non_empty,
            "unique": unique,
            "max_length": max_length,
            "check": check,
        }
    )


def _mirror_problem(mirror: str) -> str | None:
    if "://" in mirror and not mirror.startswith(("https://", "http://", "file://")):
        return "an https://, http:// or file:// URL, or a local folder path"
    if has_user_info(mirror):
        # params.yaml is committed to git and DVC copies this param into dvc.lock: a secret here leaks.
        return (
            "a URL without user name or password (params.yaml and dvc.lock are committed to git). "
            "Put the credentials in ~/.netrc (`machine <host> login <user> password <password>`, "
            "or a file named by $NETRC): the download stage sends them from there"
        )
    return None


def _device_problem(name: str, also: tuple[str, ...] = ()) -> str | None:
    """Only a device kind defined in pipeline/devices/ (one module each) can run a stage."""
    allowed = (*also, *device_names())
    if name in allowed:
        return None
    return f"one of {', '.join(map(repr, allowed))} (the device kinds defined in pipeline/devices/)"


def _device_choice_problem(name: str) -> str | None:
    return _device_problem(name, also=("auto",))


def _inside_project_problem(folder: str) -> str | None:
    """Stages write into this folder: it must stay inside the project (relative, no `..` out of it)."""
    normal = os.path.normpath(folder)
    if os.path.isabs(folder) or normal == ".." or normal.startswith(".." + os.sep):
        return "a folder inside the project, given relative to it (e.g. `runs`); symlink it to keep logs elsewhere"
    return None


def _model_name_problem(name: str) -> str | None:
    """MLflow refuses some characters in registered model names (`/` splits `models:/<name>/<version>` URIs)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._-]*", name) is None:
        return (
            "a name of letters, digits, `.`, `_`, `-` and spaces, starting with a letter or digit (e.g. `mnist-labnet`)"
        )
    return None


@dataclass(frozen=True)
class DataConfig:
    # Tried in order after $MNIST_MIRROR; each holds the four IDX files, gzipped or raw.
    mirrors: tuple[str, ...] = _rule(non_empty=True, check=_mirror_problem)
    timeout_s: float = _rule(gt=0, le=600)
    retries: int = _rule(ge=0, le=10)
    # Columns of the TensorBoard sample grid (one row per digit class).
    samples_per_class: int = _rule(ge=1, le=32)


@dataclass(frozen=True)
class ModelConfig:
    conv1_channels: int = _rule(ge=1)
    conv2_channels: int = _rule(ge=1)
    hidden_units: int = _rule(ge=1)
    conv_dropout: float = _rule(ge=0, le=0.99)
    hidden_dropout: float = _rule(ge=0, le=0.99)


# train.* settings that may say `auto` (or 0 threads) and that the train stage resolves: runs log what ran, the
# request beside it as `<key>_requested` (pipeline.training.artifacts.resolved_params, pipeline.tracking.hparams).
RESOLVED_TRAIN_KEYS = ("device", "precision", "execution", "threads")


@dataclass(frozen=True)
class TrainConfig:
    device: DeviceChoice = _rule(check=_device_choice_problem)
    # bf16 = autocast mixed precision for the forward pass (weights, optimizer, loss and evaluation stay
    # fp32); auto = bf16 where the device computes it natively (AMX/AVX512-BF16 CPUs); on CUDA, the faster
    # of the two as measured for the execution mode (pipeline/training/execution.py).
    precision: Precision = _rule()
    # 0 = one thread per available CPU core; the number used is recorded with every run.
    threads: int = _rule(ge=0, le=1024)
    # cuda_graph = each training step captured once in a CUDA graph and replayed (no per-kernel launch cost);
    # auto = cuda_graph on a CUDA device, eager elsewhere (pipeline/training/execution.py).
    execution: Execution = _rule()
    # 32 bits: the range every generator (torch, CUDA, numpy, random) accepts.
    seed: int = _rule(ge=0, le=2**32 - 1)
    # 1000 epochs of the lab's network take many hours on a CPU (docs/measurements.md): a larger number is a typo.
    epochs: int = _rule(ge=1, le=1000)
    # Train on the first N training images (0 = all 60,000): quick experiments and smoke tests.
    train_samples: int = _rule(ge=0)
    # Evaluate on the first N test images (0 = all 10,000): evaluating all of them each epoch takes seconds on
    # one CPU thread, a large share of a tiny training run (docs/measurements.md).
    test_samples: int = _rule(ge=0)
    batch_size: int = _rule(ge=1)
    test_batch_size: int = _rule(ge=1)
    lr: float = _rule(gt=0)
    gamma: float = _rule(gt=0, le=1)
    log_every_steps: int = _rule(ge=1)
    model: ModelConfig = _rule()


@dataclass(frozen=True)
class GraphConfig:
    # ONNX opset of the exported file (the torch.export-based exporter writes opset 18 or newer).
    onnx_opset: int = _rule(ge=18, le=23)
    # Batch sizes both exported programs must accept, checked against PyTorch on real test images.
    check_batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1, le=10_000)  # of 10,000 test images
    # Largest allowed |ONNX Runtime − PyTorch| difference of the log-probabilities.
    parity_atol: float = _rule(gt=0, le=1)


@dataclass(frozen=True)
class ProfileConfig:
    # One profile stage per device; each times every batch size × mode of it, paired.
    batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1, le=10_000)  # of 10,000 test images
    devices: tuple[Device, ...] = _rule(non_empty=True, unique=True, check=_device_problem)
    modes: tuple[ProfileMode, ...] = _rule(non_empty=True, unique=True)
    # Untimed steps first: oneDNN/cuDNN build kernels per shape, so a cold first step misleads.
    warmup_steps: int = _rule(ge=1, le=1000)
    # Steps traced by torch.profiler for the operator table (timing is separate, see the next two keys).
    active_steps: int = _rule(ge=2, le=10_000)
    # Each timing process times rounds until every combination's median is known to ± this many % within it (and
    # a row whose processes disagree by more, beyond the speed they shared, is flagged) ...
    ci_target_pct: float = _rule(gt=0, le=50)
    # ... or its share of this many seconds per combination has passed.
    time_budget_s: float = _rule(gt=0, le=3600)
    # Fresh processes the budget is shared among (pipeline/profiling/processes.py): the intervals come from the
    # spread between them; 1 = time in one process (intervals a rerun need not respect).
    processes: int = _rule(ge=1, le=64)
    # Program starts the timing processes are forked from, in turn (at most `processes`): each start has its own
    # address-space layout and hash seed, which all processes forked from it share (docs/timing.md).
    program_starts: int = _rule(ge=1, le=64)
    # Timing processes run side by side, each on cores of its own (at most `program_starts`: each forked from
    # another); 0 = auto (pipeline.profiling.processes.processes_at_once: up to 2 on a CPU, 1 on a GPU or while an
    # energy counter is read).
    processes_at_once: int = _rule(ge=0, le=64)
    # Seconds the `roofs` stage times a fixed workload to measure how far this machine's speed drifts between runs
    # (pipeline.records.roofs.SpeedDrift); the report states it once. 0 = not measured.
    drift_probe_s: float = _rule(ge=0, le=3600)
    # CPU threads; 0 = one per core (the number used is recorded).
    threads: int = _rule(ge=0, le=1024)
    # Seconds of the allocator what-if per CPU combination: the step timed with glibc malloc's defaults too
    # (pipeline.common.allocator); 0 = off.
    allocator_whatif_s: float = _rule(ge=0, le=3600)
    # Read the device's energy counter during the timing, where it has one (NVML on an NVIDIA GPU, RAPL on a CPU
    # whose machine exposes it): each step's energy per sample (pipeline/profiling/energy_during_timing.py).
    energy: bool = _rule()
    # Rows of the operator table.
    top_k: int = _rule(ge=1, le=200)


@dataclass(frozen=True)
class TrackingConfig:
    # MLflow experiment that every stage logs its runs into.
    # MLflow stores experiment names in a 256-character column.
    experiment: str = _rule(non_empty=True, max_length=256)
    # Root of the TensorBoard logs, inside the project; each stage run writes its own sub-folder.
    tensorboard_dir: str = _rule(non_empty=True, max_length=1024, check=_inside_project_problem)
    # MLflow Model Registry name: every training run adds a version of this model.
    registered_model: str = _rule(non_empty=True, max_length=256, check=_model_name_problem)


@dataclass(frozen=True)
class ReportConfig:
    # The hand-ins written (report/handin.<language>.md and .html): the course template, filled in.
    languages: tuple[Language, ...] = _rule(non_empty=True, unique=True)


@dataclass(frozen=True)
class Params:
    data: DataConfig = _rule()
    train: TrainConfig = _rule()
    graph: GraphConfig = _rule()
    profile: ProfileConfig = _rule()
    tracking: TrackingConfig = _rule()
    report: ReportConfig = _rule()


def section_as_dict(section: Any) -> dict[str, Any]:
    """Flatten a config section to `{"model.hidden_units": 128, ...}` for MLflow params."""
    return dict(_flatten(dataclasses.asdict(section)))


def _flatten(mapping: dict[str, Any]) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for name, value in mapping.items():
        if isinstance(value, dict):
            pairs.extend((f"{name}.{sub}", sub_value) for sub, sub_value in _flatten(value))
        else:
            pairs.append((name, list(value) if isinstance(value, tuple) else value))
    return pairs
