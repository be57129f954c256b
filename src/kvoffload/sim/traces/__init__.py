"""Streaming readers for prefix-cache traces: Mooncake FAST'25, LMCache lookup logs, generic.

Every format is JSON Lines, optionally gzip- or zstd-compressed (detected from the file's
first bytes, not its name); :mod:`.io` opens files and reads bounded lines, :mod:`.reader`
turns them into :class:`~kvoffload.sim.records.TraceRequest` objects. Each format is one
module here (``mooncake``, ``lmcache``, ``hash_ids``, ``keys_hex``) subclassing
:class:`~kvoffload.sim.traces.base.TraceFormat`, registered by name below; ``"auto"`` picks
one from the first record's fields. Adding a format: write its module, add one line below.
"""

from __future__ import annotations

from kvoffload.sim.traces.base import (
    BadRecord,
    ReaderState,
    TraceFormat,
    TraceFormatError,
    TraceRecord,
)
from kvoffload.sim.traces.io import DEFAULT_MAX_LINE_BYTES, open_trace_binary, open_trace_text
from kvoffload.sim.traces.mooncake import MOONCAKE_BLOCK_TOKENS
from kvoffload.sim.traces.reader import (
    DEFAULT_BLOCK_TOKENS,
    MixedBlockIdWarning,
    TraceReader,
    load_trace,
)
from kvoffload.sim.traces.registry import (
    TRACE_FORMAT_REGISTRY,
    detect_format,
    get_trace_format,
    trace_format_choices,
    trace_format_names,
    trace_formats,
)

# The built-in formats (loaded on first use). A new format: one module, one line here.
TRACE_FORMAT_REGISTRY.register("mooncake", "kvoffload.sim.traces.mooncake:MooncakeFormat")
TRACE_FORMAT_REGISTRY.register("lmcache", "kvoffload.sim.traces.lmcache:LMCacheFormat")
TRACE_FORMAT_REGISTRY.register("hash_ids", "kvoffload.sim.traces.hash_ids:HashIdsFormat")
TRACE_FORMAT_REGISTRY.register("keys_hex", "kvoffload.sim.traces.keys_hex:KeysHexFormat")

#: The built-in choices of ``--trace-format`` (kept for old imports; formats registered later
#: or advertised by entry points are in :func:`trace_format_choices`).
TRACE_FORMATS: tuple[str, ...] = ("auto", *TRACE_FORMAT_REGISTRY.names())

__all__ = [
    "DEFAULT_BLOCK_TOKENS",
    "DEFAULT_MAX_LINE_BYTES",
    "MOONCAKE_BLOCK_TOKENS",
    "TRACE_FORMATS",
    "TRACE_FORMAT_REGISTRY",
    "BadRecord",
    "MixedBlockIdWarning",
    "ReaderState",
    "TraceFormat",
    "TraceFormatError",
    "TraceReader",
    "TraceRecord",
    "detect_format",
    "get_trace_format",
    "load_trace",
    "open_trace_binary",
    "open_trace_text",
    "trace_format_choices",
    "trace_format_names",
    "trace_formats",
]
