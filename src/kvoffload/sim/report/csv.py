"""One CSV row per replay, the bounds at its capacity in extra columns."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from typing import IO, Any

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult
from kvoffload.sim.report.json import result_record

_CSV_SKIP = {"manager", "hit_length", "tiers"}


def result_row(result: ReplayResult, timing: bool = False) -> dict[str, Any]:
    """A flat row of a result (hit-length summary flattened, manager stats left out)."""
    record = result_record(result, timing)
    row = {k: v for k, v in record.items() if k not in _CSV_SKIP}
    for key, value in record["hit_length"].items():
        if key != "histogram":
            row[f"hit_length_{key}"] = value
    tiers = record.get("tiers")
    if tiers is not None:  # a multi-tier replay: totals, then tier_<label>_<field> columns
        for key, value in tiers.items():
            if key != "per_tier":
                row[f"tiers_{key}"] = value
        for tier in tiers["per_tier"]:
            for key, value in tier.items():
                if key != "tier":
                    row[f"tier_{tier['tier']}_{key}"] = value
    return row


def write_results_csv(
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    out: IO[str],
    timing: bool = False,
    partial: bool = False,
) -> None:
    """Write the rows (header from the first row's keys, later new keys appended).

    ``partial``: the grid was cut short; a ``partial`` column (true on every row) says so.
    """
    bounds_at = {b.capacity_blocks: b.to_dict() for b in bounds}
    rows = []
    for result in results:
        row = result_row(result, timing)
        for key, value in bounds_at.get(result.capacity_blocks, {}).items():
            if key not in row:
                row[key] = value
        if partial:
            row["partial"] = True
        rows.append(row)
    if not rows:
        return
    fieldnames: list[str] = []
    for row in rows:
        fieldnames.extend(k for k in row if k not in fieldnames)
    writer = csv.DictWriter(out, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)


__all__ = ["result_row", "write_results_csv"]
