"""`params.yaml` parsed once into frozen, typed objects, one per stage section.

params.yaml is the only place that holds values: the dataclasses below carry types and allowed
ranges but no defaults, so a key missing from the file is an error, not a silent fallback.
Validation collects every problem and reports them together, each naming the key, the value and
what is allowed, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.errors import PipelineError

DEFAULT_PARAMS_FILE = Path("params.yaml")

Device = Literal["cpu", "cuda", "mps"]
DeviceChoice = Literal["auto", "cpu", "cuda", "mps"]
ProfileMode = Literal["inference", "train"]
Precision = Literal["auto", "fp32", "bf16"]
Execution = Literal["auto", "eager", "cuda_graph"]


def _rule(
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    non_empty: bool = False,
    unique: bool = False,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A dataclass field with validation metadata (and deliberately no default)."""
    return field(metadata={"ge": ge, "gt": gt, "le": le, "non_empty": non_empty, "unique": unique, "check": check})


def _mirror_problem(mirror: str) -> str | None:
    if "://" in mirror and not mirror.startswith(("https://", "http://", "file://")):
        return "an https://, http:// or file:// URL, or a local folder path"
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


@dataclass(frozen=True)
class TrainConfig:
    device: DeviceChoice = _rule()
    # bf16 = autocast mixed precision for the forward pass (weights, optimizer, loss and evaluation stay
    # fp32); auto = bf16 where the device computes it natively (AMX/AVX512-BF16 CPUs); on CUDA, the faster
    # of the two as measured for the execution mode (pipeline/execution.py).
    precision: Precision = _rule()
    # 0 = one thread per available CPU core; the number used is recorded with every run.
    threads: int = _rule(ge=0, le=1024)
    # cuda_graph = each training step captured once in a CUDA graph and replayed (no per-kernel launch cost);
    # auto = cuda_graph on a CUDA device, eager elsewhere (pipeline/execution.py).
    execution: Execution = _rule()
    seed: int = _rule(ge=0)
    epochs: int = _rule(ge=1)
    # Train on the first N training images (0 = all 60,000): quick experiments and smoke tests.
    train_samples: int = _rule(ge=0)
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
    check_batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1)
    # Largest allowed |ONNX Runtime − PyTorch| difference of the log-probabilities.
    parity_atol: float = _rule(gt=0, le=1)


@dataclass(frozen=True)
class ProfileConfig:
    # The DVC matrix: one profile stage per batch size × device × mode.
    batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1)
    devices: tuple[Device, ...] = _rule(non_empty=True, unique=True)
    modes: tuple[ProfileMode, ...] = _rule(non_empty=True, unique=True)
    # Untimed steps first: oneDNN/cuDNN build kernels per shape, so a cold first step misleads.
    warmup_steps: int = _rule(ge=1, le=1000)
    # Steps traced by torch.profiler for the operator table (timing is separate, see the next two keys).
    active_steps: int = _rule(ge=2, le=10_000)
    # Step timing (pipeline/timing.py) samples blocks of steps until the 95 % confidence interval of the
    # median step time is within ± this many % ...
    ci_target_pct: float = _rule(gt=0, le=50)
    # ... or this many seconds per combination have passed; the row is then flagged noisy.
    time_budget_s: float = _rule(gt=0, le=3600)
    # CPU threads; 0 = one per core (the number used is recorded).
    threads: int = _rule(ge=0, le=1024)
    # Rows of the operator table.
    top_k: int = _rule(ge=1, le=200)


@dataclass(frozen=True)
class ReportConfig:
    pass


@dataclass(frozen=True)
class TrackingConfig:
    # MLflow experiment that every stage logs its runs into.
    experiment: str = _rule(non_empty=True)
    # Root of the TensorBoard logs; each stage run writes its own sub-folder.
    tensorboard_dir: str = _rule(non_empty=True)


@dataclass(frozen=True)
class Params:
    data: DataConfig = _rule()
    train: TrainConfig = _rule()
    graph: GraphConfig = _rule()
    profile: ProfileConfig = _rule()
    report: ReportConfig = _rule()
    tracking: TrackingConfig = _rule()


def load_params(path: Path = DEFAULT_PARAMS_FILE) -> Params:
    """Read and validate `path`; raise PipelineError listing every problem found."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise PipelineError(
            f"{path} not found. Run the stage from the project root (where params.yaml lives), "
            "as `dvc repro` does."
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PipelineError(f"{path} is not valid YAML ({error}). Fix the syntax and run again.") from None
    return params_from_mapping(raw, source=str(path))


def params_from_mapping(raw: Any, source: str = "params.yaml") -> Params:
    problems: list[str] = []
    params = _build(Params, raw, "", problems)
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise PipelineError(
            f"{source} has {len(problems)} invalid value(s):\n{listing}\n"
            f"Fix them in {source} (or in the `-S key=value` of `dvc exp run`) and run again."
        )
    assert params is not None
    return params


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}  # an empty section (`graph:`) is an empty mapping
    if not isinstance(raw, Mapping):
        problems.append(f"`{where}` must be a mapping of keys, got {raw!r}")
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for unknown in sorted(set(raw) - set(fields)):
        allowed = ", ".join(fields) or "no keys yet"
        problems.append(f"`{prefix}{unknown}` is not a known key (allowed in `{where}`: {allowed})")
    values = {}
    for name, spec in fields.items():
        key = f"{prefix}{name}"
        if name not in raw:
            problems.append(f"`{key}` is missing; add it to params.yaml")
            continue
        values[name] = _convert(hints[name], raw[name], key, spec.metadata, problems)
    if any(value is _INVALID for value in values.values()) or len(values) < len(fields):
        return None
    return cls(**values)


_INVALID = object()


def _convert(hint: Any, value: Any, key: str, rule: Mapping[str, Any], problems: list[str]) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        built = _build(hint, value, f"{key}.", problems)
        return _INVALID if built is None else built
    if origin is tuple:
        return _convert_list(typing.get_args(hint)[0], value, key, rule, problems)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            problems.append(f"`{key}` = {value!r} is not allowed; choose one of {', '.join(map(repr, choices))}")
            return _INVALID
        return value
    converted = _convert_scalar(hint, value)
    if converted is _INVALID:
        problems.append(f"`{key}` = {value!r} has the wrong type; expected {_type_name(hint)}")
        return _INVALID
    problem = _range_problem(converted, rule)
    if problem:
        problems.append(f"`{key}` = {value!r} is not allowed; it must be {problem}")
        return _INVALID
    return converted


def _convert_list(item_hint: Any, value: Any, key: str, rule: Mapping[str, Any], problems: list[str]) -> Any:
    if not isinstance(value, list):
        problems.append(f"`{key}` = {value!r} has the wrong type; expected a list of {_type_name(item_hint)}")
        return _INVALID
    if rule.get("non_empty") and not value:
        problems.append(f"`{key}` is an empty list; give at least one value ({_type_name(item_hint)})")
        return _INVALID
    item_rule = {**rule, "non_empty": False}
    items = [_convert(item_hint, item, f"{key}[{index}]", item_rule, problems) for index, item in enumerate(value)]
    if any(item is _INVALID for item in items):
        return _INVALID
    if rule.get("unique") and len(set(items)) != len(items):
        problems.append(f"`{key}` = {value!r} repeats a value; list each one once")
        return _INVALID
    return tuple(items)


def _convert_scalar(hint: Any, value: Any) -> Any:
    if isinstance(value, bool) and hint is not bool:
        return _INVALID  # YAML `yes`/`true` must not pass as the number 1
    if hint is float and isinstance(value, (int, float)):
        return float(value)
    if hint in (int, str, bool) and isinstance(value, hint):
        return value
    return _INVALID


def _range_problem(value: Any, rule: Mapping[str, Any]) -> str | None:
    bounds = []
    if rule.get("ge") is not None:
        bounds.append(f">= {rule['ge']:g}")
    if rule.get("gt") is not None:
        bounds.append(f"> {rule['gt']:g}")
    if rule.get("le") is not None:
        bounds.append(f"<= {rule['le']:g}")
    if isinstance(value, (int, float)) and (
        (rule.get("ge") is not None and value < rule["ge"])
        or (rule.get("gt") is not None and not value > rule["gt"])
        or (rule.get("le") is not None and value > rule["le"])
    ):
        return " and ".join(bounds)
    if rule.get("non_empty") and isinstance(value, str) and not value.strip():
        return "a non-empty string"
    check = rule.get("check")
    return check(value) if check else None


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(hint, type) and not isinstance(hint, types.GenericAlias):
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}.get(
            hint.__name__, hint.__name__
        )
    return str(hint)


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
