"""A plain mapping checked against the schema (pipeline.params.schema) into frozen, typed objects.

Validation collects every problem and reports them together, each naming the key, the value and what is
allowed. Messages show values bounded and with any URL password redacted.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.params.schema import Params

_Section = typing.TypeVar("_Section")


# Said with every params error: `dvc repro -s <stage>` (and a direct run) skips the validate stage,
# and DVC deletes a stage's outputs before running its command.
RESTORE_HINT = "Outputs DVC removed before running a stage are still in its cache: `dvc checkout` restores them."


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


def show_value(value: Any) -> str:
    """A bounded, secret-free repr for messages: a value may be megabytes long or hold a password."""
    try:
        shown = _SHORT.repr(value)
    except ValueError:  # int too large to convert to decimal
        shown = f"<{type(value).__name__} too large to show>"
    return redact(shown)


def _key_text(key: Any) -> str:
    text = key if isinstance(key, str) else show_value(key)
    return redact(text if len(text) <= 80 else text[:77] + "...")


def _build(cls: type, raw: Any, prefix: str, problems: list[str]) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if raw is None:
        raw = {}  # an empty section (`graph:`) is an empty mapping
    if not isinstance(raw, Mapping):
        problems.append(f"`{where}` must be a mapping of keys, got {show_value(raw)}")
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
            problems.append(
                f"`{key}` = {show_value(value)} is not allowed; choose one of {', '.join(map(repr, choices))}"
            )
            return _INVALID
        return value
    converted = _convert_scalar(hint, value)
    if converted is _INVALID:
        problems.append(f"`{key}` = {show_value(value)} has the wrong type; expected {_type_name(hint)}")
        return _INVALID
    problem = _range_problem(converted, rule)
    if problem:
        problems.append(f"`{key}` = {show_value(value)} is not allowed; it must be {problem}")
        return _INVALID
    return converted


def _convert_list(item_hint: Any, value: Any, key: str, rule: Mapping[str, Any], problems: list[str]) -> Any:
    if not isinstance(value, list):
        problems.append(f"`{key}` = {show_value(value)} has the wrong type; expected a list of {_type_name(item_hint)}")
        return _INVALID
    if rule.get("non_empty") and not value:
        problems.append(f"`{key}` is an empty list; give at least one value ({_type_name(item_hint)})")
        return _INVALID
    item_rule = {**rule, "non_empty": False}
    items = [_convert(item_hint, item, f"{key}[{index}]", item_rule, problems) for index, item in enumerate(value)]
    if any(item is _INVALID for item in items):
        return _INVALID
    if rule.get("unique") and len(set(items)) != len(items):
        problems.append(f"`{key}` = {show_value(value)} repeats a value; list each one once")
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
        bounds.append(f">= {_bound_text(rule['ge'])}")
    if rule.get("gt") is not None:
        bounds.append(f"> {_bound_text(rule['gt'])}")
    if rule.get("le") is not None:
        bounds.append(f"<= {_bound_text(rule['le'])}")
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


def _bound_text(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(hint, type):
        return {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}.get(
            hint.__name__, hint.__name__
        )
    return str(hint)
