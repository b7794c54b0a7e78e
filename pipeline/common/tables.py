"""Tables as text: records as CSV (the one format the plot files, operator tables and dvc plots share), and
the mark that stands for a missing number."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# What a markdown table shows where there is no number (an operator with no FLOPs, a GPU column on a CPU
# run); CSV files leave the cell empty instead, so that tools read it as missing, not as 0.
NO_NUMBER = "–"


def rows_csv(fieldnames: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A header row of `fieldnames` (so an empty table still has one), then those fields of each
    row; floats to 6 significant digits, None as an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fieldnames), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()})
    return buffer.getvalue()


def records_csv(record_type: type, records: Sequence[Any]) -> str:
    """Dataclass records of `record_type`, one column per field."""
    return rows_csv([field.name for field in dataclasses.fields(record_type)], map(dataclasses.asdict, records))
