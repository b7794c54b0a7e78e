"""A plain mapping checked against the schema (pipeline.params.schema) into frozen, typed objects.

Validation collects every problem and reports them together, each naming the key, the value and what is
allowed. Messages show values bounded and with any URL password redacted.
"""

from __future__ import annotations

import math
import reprlib
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pipeline.common.checked_dataclasses import Dialect, build
from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.params.schema import Params

_Section = typing.TypeVar("_Section")


# Said with every params error: `dvc repro -s <stage>` (and a direct run) skips the validate stage.
RESTORE_HINT = (
    "The last complete outputs are untouched: DVC keeps every output in place (`persist` in dvc.yaml) and a stage "
    "replaces its outputs only once all of them are written."
)


def params_from_mapping(raw: Any, source: str = "params.yaml") -> Params:
    dialect = _ParamsDialect()
    params = build(Params, raw, "", dialect, empty_is_mapping=True)
    if dialect.problems:
        listing = "\n".join(f"  - {problem}" for problem in dialect.problems)
        raise PipelineError(
            f"{source} has {len(dialect.problems)} invalid value(s):\n{listing}\n"
            f"Fix them in {source} (or in the `-S key=value` of `dvc exp run`) and run again. {RESTORE_HINT}"
        )
    return params  # type: ignore[no-any-return]


def params_from_section(cls: type[_Section], raw: Any, source: str, fix: str, prefix: str = "") -> _Section:
    """Validate one section (e.g. a checkpoint's stored `ModelConfig`) with the same rules as params.yaml;
    `prefix` (`model_config.`) is how its keys are named in the message."""
    dialect = _ParamsDialect()
    section = build(cls, raw, prefix.rstrip("."), dialect, empty_is_mapping=True)
    if dialect.problems:
        listing = "; ".join(dialect.problems)
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


class _ParamsDialect(Dialect):
    """params.yaml's words: keys as written in the file (`train.model.hidden_units`, `profile.devices[0]`),
    every problem collected and reported together."""

    def report(self, message: str) -> None:
        self.problems.append(message)

    def field_key(self, parent: str, cls: type, name: str) -> str:
        return f"{parent}.{name}" if parent else name

    def not_mapping(self, key: str, cls: type, value: Any) -> str:
        return f"`{key or 'the top level'}` must be a mapping of keys, got {show_value(value)}"

    def unknown(self, key: str, cls: type, unknown: list[Any], allowed: list[str]) -> list[str]:
        prefix, where, listing = f"{key}." if key else "", key or "the top level", ", ".join(allowed) or "no keys yet"
        return [f"`{prefix}{_key_text(name)}` is not a known key (allowed in `{where}`: {listing})" for name in unknown]

    MISSING = "`{key}` is missing; add it to params.yaml"
    NOT_LIST = "`{key}` = {value} has the wrong type; expected a list of {type}"
    NOT_CHOICE = "`{key}` = {value} is not allowed; choose one of {choices}"

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.show, self.type_name = show_value, _type_name  # type: ignore[method-assign]

    def not_choice(self, key: str, value: Any, choices: tuple[Any, ...]) -> str:
        return self.NOT_CHOICE.format(key=key, value=show_value(value), choices=", ".join(map(repr, choices)))

    def wrong_type(self, key: str, hint: Any, value: Any) -> str:
        return f"`{key}` = {show_value(value)} has the wrong type; expected {_type_name(hint)}"

    def value_problem(self, key: str, value: Any, converted: Any, rule: Mapping[str, Any]) -> str | None:
        problem = _range_problem(converted, rule)
        return f"`{key}` = {show_value(value)} is not allowed; it must be {problem}" if problem else None

    def list_problem(
        self, key: str, item_hint: Any, value: list[Any], items: tuple[Any, ...] | None, rule: Mapping[str, Any]
    ) -> str | None:
        if items is None and rule.get("non_empty") and not value:
            return f"`{key}` is an empty list; give at least one value ({_type_name(item_hint)})"
        if items is not None and rule.get("unique") and len(set(items)) != len(items):
            return f"`{key}` = {show_value(value)} repeats a value; list each one once"
        return None


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
