"""Mooncake (FAST'25) traces: ms timestamps, 512-token blocks, ``input_length`` sizes the tail.

``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}``; the last block
holds ``input_length - 512 * (len(hash_ids) - 1)`` tokens.
"""

from __future__ import annotations

from typing import Any

from kvoffload.sim.traces.base import ReaderState, TraceFormat, TraceRecord
from kvoffload.sim.traces.fields import as_block_ids, as_int, as_time, optional_str, require

MOONCAKE_BLOCK_TOKENS = 512


class MooncakeFormat(TraceFormat):
    """Mooncake FAST'25: hash_ids with input_length, millisecond timestamps."""

    name = "mooncake"
    default_block_tokens = MOONCAKE_BLOCK_TOKENS
    detect_priority = 10  # above hash_ids, which also has 'hash_ids'

    def detect(self, obj: dict[str, Any]) -> bool:
        # All three: a generic record may carry an optional input_length (and then its
        # timestamp, if any, is in seconds, not Mooncake's milliseconds).
        return "hash_ids" in obj and "input_length" in obj and "timestamp" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        timestamp_ms = as_time(require(obj, "timestamp"), "timestamp")
        input_tokens = as_int(require(obj, "input_length"), "input_length", 1)
        output_tokens = as_int(obj.get("output_length", 0), "output_length", 0)
        ids = as_block_ids(require(obj, "hash_ids"), "hash_ids")
        return TraceRecord(
            ids,
            timestamp_ms / 1000.0,
            input_tokens,
            output_tokens,
            optional_str(obj, "request_id"),
            optional_str(obj, "session_id"),
            optional_str(obj, "category"),
        )
