"""The JSON records of a sweep: one shape for every command and grid size."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Any

from kvoffload.sim.bounds import Bounds
from kvoffload.sim.replay import ReplayResult

# Wall-clock figures differ between two runs of the same grid: reported only when asked.
TIMING_KEYS = ("elapsed_s", "blocks_per_s")


def result_record(result: ReplayResult, timing: bool = False) -> dict[str, Any]:
    """A replay's JSON record; ``timing`` keeps :data:`TIMING_KEYS`."""
    record = result.to_dict()
    if not timing:
        for key in TIMING_KEYS:
            record.pop(key, None)
    return record


def bounds_record(bounds: Bounds, label: str | None = None) -> dict[str, Any]:
    """The bounds at one capacity, with the capacity as the user wrote it."""
    return {"capacity": label or str(bounds.capacity_blocks), **bounds.to_dict()}


def grid_record(
    trace: dict[str, Any],
    results: Sequence[ReplayResult],
    bounds: Sequence[Bounds],
    bound_labels: Sequence[str] = (),
    timing: bool = False,
) -> dict[str, Any]:
    """``{"trace", "results", "bounds"}``: the same object for one replay or a grid."""
    labels = list(bound_labels) + [""] * (len(bounds) - len(bound_labels))
    return {
        "trace": trace,
        "results": [result_record(r, timing) for r in results],
        "bounds": [bounds_record(b, label) for b, label in zip(bounds, labels, strict=True)],
    }


def dump_json(obj: Any, out: IO[str]) -> None:
    """One JSON object, indented, NaN-free."""
    json.dump(obj, out, indent=2, allow_nan=False)
    out.write("\n")


__all__ = ["TIMING_KEYS", "bounds_record", "dump_json", "grid_record", "result_record"]
