"""The generic format: ``{"hash_ids": [..]}`` plus optional fields; every block full by default.

Optional: ``timestamp`` (seconds), ``input_length`` (sizes the last block), ``output_length``,
``request_id``, ``session_id``, ``category``. A ``keys_hex`` line among them (a recording whose
first request had keys of mixed width) is read as that format reads it.
"""

from __future__ import annotations

from typing import Any

from kvoffload.sim.traces.base import ReaderState, TraceFormat, TraceRecord
from kvoffload.sim.traces.fields import as_block_ids, record_with_hints, require


class HashIdsFormat(TraceFormat):
    """Generic: hash_ids plus optional timestamp (s), input_length, output_length, session_id."""

    name = "hash_ids"

    def detect(self, obj: dict[str, Any]) -> bool:
        return "hash_ids" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        if "hash_ids" not in obj and "keys_hex" in obj:
            from kvoffload.sim.traces.keys_hex import KeysHexFormat

            return KeysHexFormat().parse(obj, state)
        ids = as_block_ids(require(obj, "hash_ids"), "hash_ids")
        input_length = obj.get("input_length")
        return record_with_hints(obj, ids, input_length)
