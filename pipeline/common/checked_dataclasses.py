"""Frozen dataclasses rebuilt from plain data (YAML, JSON), every field checked against its type hint.

One walker serves params.yaml (pipeline.params.parsing) and the profile record (pipeline.records.profile).
What differs between them is a `Dialect`: how a key is named in a message, what each message says, whether
the first problem stops the walk (a record) or every problem is collected (params, reported together), and
the value rules a field's metadata carries (params: ranges, non-empty, unique).

Supported hints: nested dataclasses, `tuple[X, ...]` (a list in the data), `dict[str, str]`, `Literal[...]`,
`X | None`, `int`, `float` (an int is accepted), `str` and `bool`. A bool is never taken for a number.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

INVALID: Any = object()  # a value that failed its check; the problem was reported


class Dialect:
    """How one kind of file names its keys and words its problems; a subclass says what differs."""

    def report(self, message: str) -> None:
        """Collect `message`, or raise it (the walk then stops)."""
        raise NotImplementedError

    def field_key(self, parent: str, cls: type, name: str) -> str:
        raise NotImplementedError

    def item_key(self, key: str, index: int) -> str:
        return f"{key}[{index}]"

    def not_mapping(self, key: str, cls: type, value: Any) -> str:
        raise NotImplementedError

    def unknown(self, key: str, cls: type, unknown: list[Any], allowed: list[str]) -> list[str]:
        raise NotImplementedError

    # Messages as templates, filled with: key, value (as `show` writes it), type (an item's, as `type_name`
    # writes it) and choices.
    MISSING = "{key} is missing"
    NOT_LIST = "{key} must be a list"
    NOT_CHOICE = "{key} is {value}, not one of {choices}"

    def show(self, value: Any) -> str:
        return repr(value)

    def type_name(self, hint: Any) -> str:
        return str(getattr(hint, "__name__", hint))

    def missing(self, key: str) -> str:
        return self.MISSING.format(key=key)

    def not_list(self, key: str, item_hint: Any, value: Any) -> str:
        return self.NOT_LIST.format(key=key, value=self.show(value), type=self.type_name(item_hint))

    def not_choice(self, key: str, value: Any, choices: tuple[Any, ...]) -> str:
        return self.NOT_CHOICE.format(key=key, value=self.show(value), choices=choices)

    def wrong_type(self, key: str, hint: Any, value: Any) -> str:
        raise NotImplementedError

    def value_problem(self, key: str, value: Any, converted: Any, rule: Mapping[str, Any]) -> str | None:
        """A scalar (as given, and converted) against the field's rules (metadata); None if it passes."""
        return None

    def list_problem(
        self, key: str, item_hint: Any, value: list[Any], items: tuple[Any, ...] | None, rule: Mapping[str, Any]
    ) -> str | None:
        """A list against the field's rules: before its items are converted (`items` None), then after."""
        return None


def build(cls: type, raw: Any, key: str, dialect: Dialect, empty_is_mapping: bool = False) -> Any:
    """`raw` as an instance of the dataclass `cls`, or INVALID after reporting what is wrong."""
    if raw is None and empty_is_mapping:
        raw = {}  # an empty YAML section (`graph:`) is an empty mapping
    if not isinstance(raw, Mapping):
        dialect.report(dialect.not_mapping(key, cls, raw))
        return INVALID
    fields = {field.name: field for field in dataclasses.fields(cls)}
    unknown = sorted((name for name in raw if name not in fields), key=str)
    if unknown:
        for message in dialect.unknown(key, cls, unknown, list(fields)):
            dialect.report(message)
    hints = typing.get_type_hints(cls)
    values = {}
    complete = True
    for name, field in fields.items():
        field_key = dialect.field_key(key, cls, name)
        if name not in raw:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                dialect.report(dialect.missing(field_key))
                complete = False
            continue
        values[name] = convert(hints[name], raw[name], field_key, field.metadata, dialect, empty_is_mapping)
        complete = complete and values[name] is not INVALID
    return cls(**values) if complete else INVALID


def convert(
    hint: Any, value: Any, key: str, rule: Mapping[str, Any], dialect: Dialect, empty_is_mapping: bool = False
) -> Any:
    """`value` as the type `hint`, or INVALID after reporting what is wrong."""
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build(hint, value, key, dialect, empty_is_mapping)
    if origin is tuple:
        return _convert_list(typing.get_args(hint)[0], value, key, rule, dialect)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(item, str) for item in value.values()):
            dialect.report(dialect.wrong_type(key, hint, value))
            return INVALID
        return dict(value)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            dialect.report(dialect.not_choice(key, value, choices))
            return INVALID
        return value
    if origin in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not type(None)]
        if len(options) != 1 or len(typing.get_args(hint)) != 2:
            raise TypeError(f"{key}: only `X | None` unions are supported")  # a programming error
        return None if value is None else convert(options[0], value, key, rule, dialect)
    converted = _convert_scalar(hint, value)
    if converted is INVALID:
        dialect.report(dialect.wrong_type(key, hint, value))
        return INVALID
    problem = dialect.value_problem(key, value, converted, rule)
    if problem:
        dialect.report(problem)
        return INVALID
    return converted


def _convert_list(item_hint: Any, value: Any, key: str, rule: Mapping[str, Any], dialect: Dialect) -> Any:
    if not isinstance(value, list):
        dialect.report(dialect.not_list(key, item_hint, value))
        return INVALID
    problem = dialect.list_problem(key, item_hint, value, None, rule)
    if problem:
        dialect.report(problem)
        return INVALID
    item_rule = {**rule, "non_empty": False}
    items = tuple(
        convert(item_hint, item, dialect.item_key(key, index), item_rule, dialect) for index, item in enumerate(value)
    )
    if any(item is INVALID for item in items):
        return INVALID
    problem = dialect.list_problem(key, item_hint, value, items, rule)
    if problem:
        dialect.report(problem)
        return INVALID
    return items


def _convert_scalar(hint: Any, value: Any) -> Any:
    if isinstance(value, bool) and hint is not bool:
        return INVALID  # YAML `yes`/`true` must not pass as the number 1
    if hint is float and isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer beyond float range
            return math.inf  # a rule refuses it as non-finite where the dialect has one
    if hint in (int, str, bool) and isinstance(value, hint):
        return value
    return INVALID
