"""The generic format: ``{"hash_ids": [..]}`` plus optional fields; every block full by default.

Optional: ``timestamp`` (seconds), ``input_length`` (sizes the last block), ``output_length``,
``request_id``, ``session_id``, ``category``.
"""

from __future__ import annotations

from typing import Any

from kvoffload.sim.traces.base import ReaderState, TraceFormat, TraceRecord
from kvoffload.sim.traces.fields import (
    as_block_ids,
    as_int,
    optional_str,
    optional_time,
    require,
)


class HashIdsFormat(TraceFormat):
    """Generic: hash_ids plus optional timestamp (s), input_length, output_length, session_id."""

    name = "hash_ids"

    def detect(self, obj: dict[str, Any]) -> bool:
        return "hash_ids" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        ids = as_block_ids(require(obj, "hash_ids"), "hash_ids")
        input_length = obj.get("input_length")
        return TraceRecord(
            ids,
            optional_time(obj, "timestamp"),
            None if input_length is None else as_int(input_length, "input_length", 1),
            as_int(obj.get("output_length", 0), "output_length", 0),
            optional_str(obj, "request_id"),
            optional_str(obj, "session_id"),
            optional_str(obj, "category"),
        )
