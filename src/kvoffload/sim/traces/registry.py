"""The trace-format registry: built-in formats by name, out-of-tree ones by entry point.

A new format is one module (a :class:`~kvoffload.sim.traces.base.TraceFormat` subclass) and
one ``TRACE_FORMAT_REGISTRY.register(name, "module:Class")`` line in ``traces/__init__.py``;
a distribution can advertise one in the entry-point group ``kvoffload.trace_formats``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from kvoffload.registry import Registry
from kvoffload.sim.traces.base import BadRecord, TraceFormat

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kvoffload.trace_formats"


def _as_trace_format(name: str, obj: object) -> TraceFormat:
    """A ``TraceFormat`` subclass is instantiated; an instance is used as it is."""
    if inspect.isclass(obj) and issubclass(obj, TraceFormat) and not inspect.isabstract(obj):
        obj = obj()
    if not isinstance(obj, TraceFormat):
        what = obj.__qualname__ if inspect.isclass(obj) else type(obj).__name__ + " instance"
        raise TypeError(
            f"Trace format '{name}' resolved to {what}, which is not a concrete "
            "kvoffload.sim.traces.base.TraceFormat."
        )
    return obj


#: Names -> lazily loaded trace formats (``--trace-format`` lists these, plus ``auto``).
TRACE_FORMAT_REGISTRY: Registry[TraceFormat] = Registry(
    "trace format",
    _as_trace_format,
    base=TraceFormat,
    entry_point_group=ENTRY_POINT_GROUP,
    logger=logger,
)


def trace_format_names() -> list[str]:
    """Every registered or advertised format name (registration order, then entry points)."""
    names = TRACE_FORMAT_REGISTRY.names()
    return names + [n for n in TRACE_FORMAT_REGISTRY.entry_point_names() if n not in names]


def trace_format_choices() -> tuple[str, ...]:
    """``("auto", *names)``: what ``--trace-format`` accepts."""
    return ("auto", *trace_format_names())


def get_trace_format(name: str) -> TraceFormat:
    """The format registered (or advertised) as ``name``; ``ValueError`` with a did-you-mean."""
    return TRACE_FORMAT_REGISTRY.resolve(name)


def trace_formats() -> list[TraceFormat]:
    """Every format that loads, in detection order; one that cannot load is logged, skipped."""
    formats: list[TraceFormat] = []
    for name in trace_format_names():
        try:
            formats.append(get_trace_format(name))
        except (ImportError, TypeError, ValueError) as exc:
            logger.warning("Skipping trace format '%s': %s", name, exc)
    return sorted(formats, key=lambda f: -f.detect_priority)  # stable: ties keep their order


def detect_trace_format(obj: dict[str, Any]) -> TraceFormat:
    """The highest-priority format whose ``detect`` accepts the record ``obj``."""
    for fmt in trace_formats():
        if fmt.detect(obj):
            return fmt
    raise BadRecord(
        "cannot tell the trace format: expected 'hash_ids' (Mooncake / generic) or "
        f"'chunk_hashes' (LMCache); fields present: {sorted(obj)[:8]}; known formats: "
        f"{trace_format_names()}"
    )


def detect_format(obj: dict[str, Any]) -> str:
    """The name of the format a record belongs to, from its fields."""
    return detect_trace_format(obj).name


__all__ = [
    "ENTRY_POINT_GROUP",
    "TRACE_FORMAT_REGISTRY",
    "detect_format",
    "detect_trace_format",
    "get_trace_format",
    "trace_format_choices",
    "trace_format_names",
    "trace_formats",
]
