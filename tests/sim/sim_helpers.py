"""Helpers shared by the simulator tests: the shared trace's path and a libCacheSim oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import require_shared_trace
from kvoffload.testing.libcachesim import libcachesim_hits as replay_libcachesim
from kvoffload.testing.libcachesim import make_cache

SYNTHETIC_UNIQUE_BLOCKS = 43924


def shared_trace_path() -> Path:
    """The shared Mooncake synthetic trace; skips the test when it is absent."""
    return require_shared_trace()


def libcachesim_hits(lcs: Any, class_name: str, capacity: int, seq: list[int]) -> int:
    """Hits of libCacheSim's ``class_name`` on ``seq`` (one unit-size object per block);
    Belady gets each request's next use."""
    cache = make_cache(class_name, capacity, hashpower=20)
    return replay_libcachesim(cache, seq, with_next_use=class_name == "Belady")


def write_jsonl(path: Path, records: list[Any]) -> Path:
    """Write one JSON value (or a raw string line) per line."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path
