"""Field checks every format parser shares; each raises :class:`BadRecord` naming the field."""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

from kvoffload.sim.traces.base import BadRecord, TraceRecord


def require(obj: dict[str, Any], name: str) -> Any:
    """``obj[name]``, or ``BadRecord`` when the field is missing."""
    if name not in obj:
        raise BadRecord(f"missing field '{name}'")
    return obj[name]


def as_int(value: Any, name: str, minimum: int) -> int:
    """An integer >= ``minimum`` (a float with an integer value is accepted)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise BadRecord(f"'{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise BadRecord(f"'{name}' must be >= {minimum}, got {value}")
    return int(value)


def as_time(value: Any, name: str) -> float:
    """A finite number (a time on the file's clock)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRecord(f"'{name}' must be a finite number, got {value!r}")
    return float(value)


def optional_time(obj: dict[str, Any], name: str) -> float | None:
    """``as_time`` of an optional field (``None`` when absent or null)."""
    value = obj.get(name)
    return None if value is None else as_time(value, name)


_ID_TYPES = frozenset((int, str))


def as_block_ids(value: Any, name: str) -> list[Hashable]:
    """A non-empty list of int or string block ids."""
    if not isinstance(value, list):
        raise BadRecord(f"'{name}' must be a list of block ids, got {type(value).__name__}")
    if not value:
        raise BadRecord(f"'{name}' is empty: a request needs at least one block")
    if _ID_TYPES.issuperset(map(type, value)):  # the usual case, checked in C
        return value
    for i, block_id in enumerate(value):
        if isinstance(block_id, bool) or not isinstance(block_id, (int, str)):
            raise BadRecord(f"'{name}'[{i}] must be an integer or a string, got {block_id!r}")
    return value


def optional_str(obj: dict[str, Any], name: str) -> str | None:
    """An optional string field (an int is turned into its string)."""
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRecord(f"'{name}' must be a string, got {value!r}")
    return str(value)


__all__ = [
    "as_block_ids",
    "as_int",
    "as_time",
    "optional_str",
    "optional_time",
    "record_with_hints",
    "require",
]


def record_with_hints(obj: dict[str, Any], ids: list[Hashable], input_length: Any) -> TraceRecord:
    """A record of ``ids`` with the optional fields every hash-list format shares."""
    return TraceRecord(
        ids,
        optional_time(obj, "timestamp"),
        None if input_length is None else as_int(input_length, "input_length", 1),
        as_int(obj.get("output_length", 0), "output_length", 0),
        optional_str(obj, "request_id"),
        optional_str(obj, "session_id"),
        optional_str(obj, "category"),
    )
