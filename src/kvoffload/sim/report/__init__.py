"""What people read (tables, plots) and what scripts read (JSON, CSV) from a sweep.

``json`` and ``csv`` need only the standard library; ``table`` needs rich (the ``[cli]``
extra) and ``plot`` matplotlib (the ``[plot]`` extra), so both are imported only when used:
``kvoffload simulate --format json -o out.csv`` works without either.
"""

from __future__ import annotations

from typing import Any

from kvoffload.sim.report.csv import result_row, write_results_csv
from kvoffload.sim.report.json import (
    TIMING_KEYS,
    bounds_record,
    dump_json,
    grid_record,
    result_record,
)

_TABLE_NAMES = ("bounds_table", "key_value_table", "results_table", "stdout_console")


def __getattr__(name: str) -> Any:
    """The rich-based table helpers, imported on first use."""
    if name in _TABLE_NAMES:
        from kvoffload.sim.report import table

        return getattr(table, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TIMING_KEYS",
    "bounds_record",
    "bounds_table",
    "dump_json",
    "grid_record",
    "key_value_table",
    "result_record",
    "result_row",
    "results_table",
    "stdout_console",
    "write_results_csv",
]
