"""`params.yaml` parsed once into frozen, typed objects, one per stage section.

params.yaml is the only place that holds values: the dataclasses below carry types and allowed
ranges but no defaults, so a key missing from the file is an error, not a silent fallback.
Validation collects every problem and reports them together, each naming the key, the value and
what is allowed, before any stage does work.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import reprlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.credentials import has_user_info, redact
from pipeline.errors import PipelineError

DEFAULT_PARAMS_FILE = Path("params.yaml")
_Section = typing.TypeVar("_Section")

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
    # 32 bits: the range every generator (torch, CUDA, numpy, random) accepts.
    seed: int = _rule(ge=0, le=2**32 - 1)
    # 1000 epochs of the lab's network take ~10 h on 2 CPU cores: a larger number is a typo.
    epochs: int = _rule(ge=1, le=1000)
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
    check_batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1, le=10_000)  # of 10,000 test images
    # Largest allowed |ONNX Runtime − PyTorch| difference of the log-probabilities.
    parity_atol: float = _rule(gt=0, le=1)


@dataclass(frozen=True)
class ProfileConfig:
    # The DVC matrix: one profile stage per batch size × device × mode.
    batch_sizes: tuple[int, ...] = _rule(non_empty=True, unique=True, ge=1, le=10_000)  # of 10,000 test images
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
    # MLflow stores experiment names in a 256-character column.
    experiment: str = _rule(non_empty=True, max_length=256)
    # Root of the TensorBoard logs, inside the project; each stage run writes its own sub-folder.
    tensorboard_dir: str = _rule(non_empty=True, max_length=1024, check=_inside_project_problem)
    # MLflow Model Registry name: every training run adds a version of this model.
    registered_model: str = _rule(non_empty=True, max_length=256, check=_model_name_problem)


@dataclass(frozen=True)
class Params:
    data: DataConfig = _rule()
    train: TrainConfig = _rule()
    graph: GraphConfig = _rule()
    profile: ProfileConfig = _rule()
    report: ReportConfig = _rule()
    tracking: TrackingConfig = _rule()


# Said with every params error: `dvc repro -s <stage>` (and a direct run) skips the validate stage,
# and DVC deletes a stage's outputs before running its command.
RESTORE_HINT = "Outputs DVC removed before running a stage are still in its cache: `dvc checkout` restores them."
# params.yaml is a few kB; a file this large is a mistake (or an attack), and parsing it would be slow.
MAX_PARAMS_BYTES = 1 << 20


def load_params(path: Path = DEFAULT_PARAMS_FILE) -> Params:
    """Read and validate `path`; raise PipelineError listing every problem found.

    Beyond the value checks, the parsed params must fit this machine (`pipeline.resources`): a model
    or batch too large for its memory is refused here, naming the key, not by a failed allocation.
    """
    raw = read_params_file(Path(path))
    params = params_from_mapping(raw, source=str(path))
    # Imported here: pipeline.resources imports this module.
    from pipeline.resources import check_params_fit_memory

    check_params_fit_memory(params, source=str(path))
    return params


def read_params_file(path: Path) -> Any:
    """The YAML in `path` as plain data: strict (no aliases, no duplicate keys), size-bounded, UTF-8."""
    fix = f"Fix {path} and run again. {RESTORE_HINT}"
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_PARAMS_BYTES + 1)
    except FileNotFoundError:
        raise PipelineError(
            f"{path} not found. Run the stage from the project root (where params.yaml lives), as `dvc repro` does."
        ) from None
    except OSError as error:  # a directory, unreadable, ...
        raise PipelineError(
            f"{path} cannot be read ({error.strerror}): it must be a readable YAML file. {fix}"
        ) from None
    if len(data) > MAX_PARAMS_BYTES:
        raise PipelineError(
            f"{path} is larger than {MAX_PARAMS_BYTES // 1024} KiB; params.yaml holds a few settings. {fix}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise PipelineError(
            f"{path} is not UTF-8 text: byte {data[error.start]:#04x} on line {line} is not valid UTF-8. "
            f"Save it as UTF-8. {fix}"
        ) from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as error:
        raise PipelineError(f"{path} is not valid YAML ({redact(str(error))}). {fix}") from None
    except (ValueError, RecursionError) as error:  # an integer of more than 4300 digits; nesting thousands deep
        raise PipelineError(f"{path} holds a value this pipeline cannot read ({_show(str(error))}). {fix}") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and duplicate keys.

    Aliases let a few hundred bytes expand to gigabytes once traversed (the "billion laughs"); params
    need none. A duplicate key is almost always an edit gone wrong, and YAML loaders disagree on it:
    PyYAML keeps the last value while DVC's loader refuses the file.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            problem = f"aliases (*{event.anchor}) are not allowed in params; write the value out"
            raise yaml.composer.ComposerError(None, None, problem, event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # SafeLoader itself refuses an unhashable key, with its own message
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {_show(key)} appears twice in one mapping; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def params_from_mapping(raw: Any, source: str = "params.yaml") -> Params:
    problems: list[str] = []
    params: Params | None = _build(Params, raw, "", problems)
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        raise PipelineError(
            f"{source} has {len(problems)} invalid value(s):\n{listing}\n"
            f"Fix them in {source} (or in the `-S key=value` of `dvc exp run`) and run again. {RESTORE_HINT}"
        )
    assert params is not None
    return params


def params_from_section(cls: type[_Section], raw: Any, source: str, fix: str, prefix: str = "") -> _Section:
    """Validate one section (e.g. a checkpoint's stored `ModelConfig`) with the same rules as params.yaml;
    `prefix` (`model_config.`) is how its keys are named in the message."""
    problems: list[str] = []
    section = _build(cls, raw, prefix, problems)
    if problems:
        listing = "; ".join(problems)
        raise PipelineError(f"{source} is invalid: {listing}. {fix}")
    return section  # type: ignore[no-any-return]


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 6, 6


def _show(value: Any) -> str:
    """A bounded, secret-free repr for messages: a value may be megabytes long or hold a password."""
    try:
        shown = _SHORT.repr(value)
    except ValueError:  # int too large to convert to decimal
        shown = f"<{type(value).__name__} too large to show>"
    return redact(shown)


def _key_text(key: Any) -> str:
    text = key if isinstance(key, str) else _show(key)
    return redact(text if len(text) <= 80 else text[:77] + "...")


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}  # an empty section (`graph:`) is an empty mapping
    if not isinstance(raw, Mapping):
        problems.append(f"`{where}` must be a mapping of keys, got {_show(raw)}")
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for unknown in sorted((key for key in raw if key not in fields), key=str):
        allowed = ", ".join(fields) or "no keys yet"
        problems.append(f"`{prefix}{_key_text(unknown)}` is not a known key (allowed in `{where}`: {allowed})")
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        built = _build(hint, value, f"{key}.", problems)
        return _INVALID if built is None else built
    if origin is tuple:
        return _convert_list(typing.get_args(hint)[0], value, key, rule, problems)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            problems.append(f"`{key}` = {_show(value)} is not allowed; choose one of {', '.join(map(repr, choices))}")
            return _INVALID
        return value
    converted = _convert_scalar(hint, value)
    if converted is _INVALID:
        problems.append(f"`{key}` = {_show(value)} has the wrong type; expected {_type_name(hint)}")
        return _INVALID
    problem = _range_problem(converted, rule)
    if problem:
        problems.append(f"`{key}` = {_show(value)} is not allowed; it must be {problem}")
        return _INVALID
    return converted


def _convert_list(item_hint: Any, value: Any, key: str, rule: Mapping[str, Any], problems: list[str]) -> Any:
    if not isinstance(value, list):
        problems.append(f"`{key}` = {_show(value)} has the wrong type; expected a list of {_type_name(item_hint)}")
        return _INVALID
    if rule.get("non_empty") and not value:
        problems.append(f"`{key}` is an empty list; give at least one value ({_type_name(item_hint)})")
        return _INVALID
    item_rule = {**rule, "non_empty": False}
    items = [_convert(item_hint, item, f"{key}[{index}]", item_rule, problems) for index, item in enumerate(value)]
    if any(item is _INVALID for item in items):
        return _INVALID
    if rule.get("unique") and len(set(items)) != len(items):
        problems.append(f"`{key}` = {_show(value)} repeats a value; list each one once")
        return _INVALID
    return tuple(items)


def _convert_scalar(hint: Any, value: Any) -> Any:
    if isinstance(value, bool) and hint is not bool:
        return _INVALID  # YAML `yes`/`true` must not pass as the number 1
    if hint is float and isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range
            return math.inf  # refused as non-finite by _range_problem
    if hint in (int, str, bool) and isinstance(value, hint):
        return value
    return _INVALID


def _range_problem(value: Any, rule: Mapping[str, Any]) -> str | None:
    bounds = []
    if rule.get("ge") is not None:
        bounds.append(f">= {_number(rule['ge'])}")
    if rule.get("gt") is not None:
        bounds.append(f"> {_number(rule['gt'])}")
    if rule.get("le") is not None:
        bounds.append(f"<= {_number(rule['le'])}")
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number (not .inf or .nan)"
    if isinstance(value, (int, float)) and (
        (rule.get("ge") is not None and value < rule["ge"])
        or (rule.get("gt") is not None and not value > rule["gt"])
        or (rule.get("le") is not None and value > rule["le"])
    ):
        return " and ".join(bounds)
    if rule.get("non_empty") and isinstance(value, str) and not value.strip():
        return "a non-empty string"
    if rule.get("max_length") is not None and isinstance(value, str) and len(value) > rule["max_length"]:
        return f"at most {rule['max_length']} characters long (it has {len(value)})"
    check = rule.get("check")
    return check(value) if check else None


def _number(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(hint, type):
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
