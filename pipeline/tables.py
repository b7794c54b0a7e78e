"""Dataclass records as CSV text: the one format the plot files, operator tables and dvc plots share."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Sequence
from typing import Any


def records_csv(record_type: type, records: Sequence[Any]) -> str:
    """A header row from `record_type`'s fields (so an empty table still has one), then one row per
    record; floats to 6 significant digits."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[f.name for f in dataclasses.fields(record_type)], lineterminator="\n")
    writer.writeheader()
    for record in records:
        row = dataclasses.asdict(record)
        writer.writerow({key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()})
    return buffer.getvalue()
