"""LMCache lookup-hash logs: ``chunk_hashes`` with a ``chunk_size`` that sets the block size.

``{"timestamp": s, "request_id": .., "chunk_size": n, "seq_len": n, "chunk_hashes": [..]}``;
``seq_len`` sizes the last chunk (tokens past the last chunk were never hashed). One trace
uses one chunk size.
"""

from __future__ import annotations

from typing import Any

from kvoffload.sim.traces.base import BadRecord, ReaderState, TraceFormat, TraceRecord
from kvoffload.sim.traces.fields import as_block_ids, as_int, optional_str, optional_time, require


class LMCacheFormat(TraceFormat):
    """LMCache lookup-hash log: chunk_hashes, chunk_size, seq_len, timestamps in seconds."""

    name = "lmcache"
    default_block_tokens = None  # from the records' chunk_size
    length_field = "seq_len"
    detect_priority = 20

    def detect(self, obj: dict[str, Any]) -> bool:
        return "chunk_hashes" in obj

    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        ids = as_block_ids(require(obj, "chunk_hashes"), "chunk_hashes")
        block_tokens = state.block_tokens
        if "chunk_size" in obj:
            chunk_size = as_int(obj["chunk_size"], "chunk_size", 1)
            if block_tokens is None:
                block_tokens = state.block_tokens = chunk_size
            elif chunk_size != block_tokens:
                raise BadRecord(
                    f"'chunk_size' = {chunk_size} differs from the trace's block size "
                    f"{block_tokens}; one trace must use one chunk size"
                )
        if block_tokens is None:
            raise BadRecord("missing field 'chunk_size' (or pass the block size explicitly)")
        seq_len = obj.get("seq_len")
        input_tokens = None
        if seq_len is not None:
            seq = as_int(seq_len, "seq_len", 1)
            if seq <= block_tokens * (len(ids) - 1):
                raise BadRecord(
                    f"'seq_len' = {seq} is too short for {len(ids)} chunks of {block_tokens} tokens"
                )
            input_tokens = min(seq, block_tokens * len(ids))  # past the last chunk: unhashed
        return TraceRecord(
            ids,
            optional_time(obj, "timestamp"),
            input_tokens,
            0,
            optional_str(obj, "request_id"),
            optional_str(obj, "session_id"),
            optional_str(obj, "category"),
        )
