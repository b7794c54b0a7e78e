"""The hand-in's messages, one catalogue per language (`messages/<language>.toml`): every sentence and label the
hand-in prints comes from there, so a language is added by adding a file, and the code holds no prose."""

from __future__ import annotations

import string
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from pipeline.devices.registry import device_kinds
from pipeline.params.schema import Language

CATALOGUES = Path(__file__).with_name("messages")
LANGUAGES: tuple[str, ...] = typing.get_args(Language)
HTML_LANGUAGE = {"zh": "zh-CN", "en": "en"}  # the page's `lang`: which fonts the browser picks for its text


@dataclass(frozen=True)
class Catalogue:
    language: str
    messages: dict[str, str]

    def __call__(self, key: str, **values: object) -> str:
        """The message `key` with its placeholders filled (a missing key or placeholder is a programming error)."""
        return self.messages[key].format(**values)

    def counted(self, count: int, one: str, many: str) -> str:
        """`count` with its noun, `{count}` filled: the message `one` where it is 1, else `many` (English's singular
        and plural; a language without them says the same words in both)."""
        return self(one if count == 1 else many, count=count)


def catalogue_path(language: str) -> Path:
    return CATALOGUES / f"{language}.toml"


def load_catalogue(language: str) -> Catalogue:
    """The language's messages, and each device kind's name in it as `device_<name>` (its kind says it)."""
    with catalogue_path(language).open("rb") as handle:
        messages = {key: str(value) for key, value in tomllib.load(handle).items()}
    for kind in device_kinds().values():
        messages.setdefault(f"device_{kind.name}", kind.names.get(language, kind.label))
    return Catalogue(language, messages)


def placeholders(message: str) -> set[tuple[str, str]]:
    """The `{name:format}` fields of a message, as (name, format spec) pairs."""
    return {(name, spec or "") for _, name, spec, _ in string.Formatter().parse(message) if name is not None}
