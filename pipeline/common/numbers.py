"""Numbers rounded to what they can support, for files people diff (DVC metrics)."""

from __future__ import annotations

import math


def significant(value: float, digits: int) -> float:
    """`value` rounded to `digits` significant digits (0 and non-finite values unchanged)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))
