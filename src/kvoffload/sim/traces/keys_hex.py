"""The recorder's compact format: a request's keys as one hex string of fixed-width keys.

``{"keys_hex": "<hex>", "key_bytes": 12}`` plus the generic format's optional fields
(``timestamp``, ``input_length``, ``output_length``, ``request_id``, ``session_id``,
``category``). :class:`~kvoffload.manager.recorder.TraceRecorder` writes it because one hex
conversion of a request's concatenated keys costs far less on the serving path than one per
key; each key is the ``2 * key_bytes`` hex digits at its place. A key repeated within a
request is read once (the manager counts one access per request and key), and then the
record's ``input_length`` (written for the keys as offered) is not used. The recorder writes a
request whose keys differ in width as a ``hash_ids`` line in the same file; it is read here
as that format reads it (its ids are the same hex strings, so a key is one block either way).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvoffload.sim.traces.base import BadRecord, ReaderState, TraceFormat, TraceRecord
from kvoffload.sim.traces.fields import as_block_ids, as_int, record_with_hints, require


class KeysHexFormat(TraceFormat):
    """Recorded: keys_hex (fixed-width keys as hex) plus the hash_ids format's optional fields."""

    name = "keys_hex"

    def detect(self, obj: dict[str, Any]) -> bool:
        return "keys_hex" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        if "keys_hex" not in obj and "hash_ids" in obj:
            ids = as_block_ids(obj["hash_ids"], "hash_ids")
            return record_with_hints(obj, ids, obj.get("input_length"))
        text = require(obj, "keys_hex")
        width = 2 * as_int(require(obj, "key_bytes"), "key_bytes", 1)
        if not isinstance(text, str) or not text:
            raise BadRecord(f"'keys_hex' must be a non-empty hex string, got {text!r}")
        if len(text) % width:
            raise BadRecord(
                f"'keys_hex' has {len(text)} hex digits, not a multiple of 2 * key_bytes ({width})"
            )
        try:
            bytes.fromhex(text)
        except ValueError:
            raise BadRecord("'keys_hex' is not a hex string") from None
        every = [text[i : i + width] for i in range(0, len(text), width)]
        ids: list[Hashable] = list(dict.fromkeys(every))
        input_length = obj.get("input_length")
        if len(ids) != len(every):  # the length was of the keys as written, repeats included
            input_length = None
        return record_with_hints(obj, ids, input_length)
