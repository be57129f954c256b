"""Helpers shared by the simulator tests: the shared trace's path and a libCacheSim oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import require_shared_trace

SYNTHETIC_UNIQUE_BLOCKS = 43924


def shared_trace_path() -> Path:
    """The shared Mooncake synthetic trace; skips the test when it is absent."""
    return require_shared_trace()


def libcachesim_hits(lcs: Any, class_name: str, capacity: int, seq: list[int]) -> int:
    """Hits of libCacheSim's ``class_name`` on ``seq`` (one unit-size object per block).

    Belady needs ``next_access_vtime`` (the next position of the same id, INT64_MAX if none).
    """
    cache = getattr(lcs, class_name)(cache_size=capacity, hashpower=20)
    req = lcs.Request()
    req.obj_size = 1
    req.op = lcs.ReqOp.OP_READ
    next_use = [0] * len(seq)
    if class_name == "Belady":
        last: dict[int, int] = {}
        for i in range(len(seq) - 1, -1, -1):
            next_use[i] = last.get(seq[i], 2**63 - 1)
            last[seq[i]] = i
    hits = 0
    for i, oid in enumerate(seq):
        req.obj_id = oid
        req.clock_time = i
        req.next_access_vtime = next_use[i]
        hits += bool(cache.get(req))
    return hits


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write one JSON value (or a raw string line) per line."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path
