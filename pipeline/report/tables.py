"""Markdown tables, as the report writes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """Lines of a markdown table. A column named with a leading `>` is right-aligned (numbers): `">batch"`."""
    header = " | ".join(column.removeprefix(">") for column in columns)
    rule = " | ".join("---:" if column.startswith(">") else "---" for column in columns)
    return [f"| {header} |", f"| {rule} |", *("| " + " | ".join(map(str, row)) + " |" for row in rows)]
