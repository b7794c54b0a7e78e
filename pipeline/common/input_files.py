"""Another stage's output read and checked at the edge: a file that is empty, cut short, not JSON or CSV, without a
field the reader needs, or holding NaN or an infinity is a PipelineError naming the file, what is wrong, and the
stage whose rerun writes it again (`dvc repro -f <stage>`), never a traceback or a number printed as "nan".

A missing file is the caller's to judge (the report names what has not run yet): these readers take files that
exist, or say that one a reader cannot do without is missing.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError


def rerun(stage: str) -> str:
    return f"rerun `dvc repro -f {stage}` to write it again. Nothing was written."


def read_text(path: Path, stage: str) -> str:
    """The file's text; missing, unreadable as UTF-8, or blank is a user error."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing; {rerun(stage)}") from None
    except UnicodeDecodeError as error:
        raise PipelineError(f"{path} is not text ({error.reason} at byte {error.start}); {rerun(stage)}") from None
    if not text.strip():
        raise PipelineError(f"{path} is empty; {rerun(stage)}")
    return text


def _refuse_constant(name: str) -> float:
    raise ValueError(name)


def read_json_object(
    path: Path, stage: str, numbers: tuple[str, ...] = (), texts: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A JSON object holding each of `numbers` as a finite number and each of `texts` as a non-empty string; no
    value anywhere in it may be NaN or infinite."""
    text = read_text(path, stage)
    try:
        found = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        cut = "" if text.rstrip().endswith(("}", "]")) else " (cut short?)"
        raise PipelineError(f"{path} is not valid JSON{cut} ({error}); {rerun(stage)}") from None
    except ValueError as error:  # NaN, Infinity, -Infinity: JSON has no such numbers
        raise PipelineError(f"{path} holds {error}, which is not a number a report can state; {rerun(stage)}") from None
    if not isinstance(found, dict):
        raise PipelineError(f"{path} is not a JSON object (it holds a {type(found).__name__}); {rerun(stage)}")
    for key in numbers:
        value = found.get(key)
        if key not in found:
            raise PipelineError(f"{path} has no `{key}`; {rerun(stage)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PipelineError(f"{path}: `{key}` is {json.dumps(value)}, not a number; {rerun(stage)}")
    for key in texts:
        value = found.get(key)
        if key not in found:
            raise PipelineError(f"{path} has no `{key}`; {rerun(stage)}")
        if not isinstance(value, str) or not value.strip():
            raise PipelineError(f"{path}: `{key}` is {json.dumps(value)}, not a non-empty text; {rerun(stage)}")
    _refuse_infinite(path, stage, found, "")
    return found


def _refuse_infinite(path: Path, stage: str, value: object, where: str) -> None:
    """A number too large for a float (`1e999`) is read as infinity: refused like NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PipelineError(f"{path}: `{where}` is {value}, not a finite number; {rerun(stage)}")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_infinite(path, stage, item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_infinite(path, stage, item, f"{where}[{index}]")


def read_number_csv(path: Path, stage: str, columns: tuple[str, ...]) -> list[dict[str, float]]:
    """The rows of a CSV of numbers with at least `columns`: at least one row, every row complete and every value
    a finite number. A file whose last line has no line end was cut mid-row (this pipeline ends every row)."""
    text = read_text(path, stage)
    if not text.endswith("\n"):
        raise PipelineError(f"{path} ends mid-row (its last line has no line end: cut short); {rerun(stage)}")
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    absent = [column for column in columns if column not in header]
    if absent:
        named = ", ".join(absent)
        raise PipelineError(f"{path} has no column {named} (its header: {','.join(header)}); {rerun(stage)}")
    rows: list[dict[str, float]] = []
    for line, cells in enumerate(reader, start=2):
        if len(cells) != len(header):
            raise PipelineError(
                f"{path}, line {line}: {len(cells)} values where the header has {len(header)}; {rerun(stage)}"
            )
        row = {}
        for name, cell in zip(header, cells, strict=True):
            try:
                value = float(cell)
            except ValueError:
                problem = f"`{name}` is {cell!r}, not a number"
                raise PipelineError(f"{path}, line {line}: {problem}; {rerun(stage)}") from None
            if not math.isfinite(value):
                raise PipelineError(f"{path}, line {line}: `{name}` is {cell}, not a finite number; {rerun(stage)}")
            row[name] = value
        rows.append(row)
    if not rows:
        raise PipelineError(f"{path} has only its header, no rows; {rerun(stage)}")
    return rows
