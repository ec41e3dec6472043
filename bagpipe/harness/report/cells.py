"""How a report turns recorded values into table cells: one rule for a missing number."""

from __future__ import annotations

import math

import pandas as pd


def column_mean(group: pd.DataFrame, column: str) -> float:
    """Mean of ``column`` as numbers (params come as text from records); ``nan`` if absent."""
    if column not in group:
        return math.nan
    return float(pd.to_numeric(group[column], errors="coerce").mean())


def cell(value: object, fmt: str, unit: str = "") -> str:
    """``value`` formatted with ``unit``; ``–`` for a value not recorded (None, NaN, inf)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return format(value, fmt) + unit
