"""Replay block ids through a libCacheSim cache: the reference our exactness claims compare to.

Each block is a unit-size object read once per access, at a logical time equal to its
position (libCacheSim's own model, and the protocol of :func:`~kvoffload.testing.drive.
drive_single_blocks`). ``libcachesim`` (the Python binding, 0.3.5) is imported only when a
cache is built, so this module imports without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

NEVER = 2**63 - 1  # libCacheSim's "no next access" (INT64_MAX)


def make_cache(class_name: str, capacity: int, hashpower: int = 16, **params: Any) -> Any:
    """libCacheSim's ``class_name`` cache (``"LRU"``, ``"ARC"``, ``"Belady"``...) of ``capacity``
    unit-size objects."""
    import libcachesim

    return getattr(libcachesim, class_name)(capacity, hashpower=hashpower, **params)


def next_use_positions(block_ids: Sequence[int]) -> list[int]:
    """For each position, the next position of the same id (:data:`NEVER` if none): what
    Belady needs in ``next_access_vtime``."""
    out = [NEVER] * len(block_ids)
    last: dict[int, int] = {}
    for i in range(len(block_ids) - 1, -1, -1):
        out[i] = last.get(block_ids[i], NEVER)
        last[block_ids[i]] = i
    return out


def libcachesim_hits(cache: Any, block_ids: Sequence[int], with_next_use: bool = False) -> int:
    """Replay ``block_ids`` through ``cache`` (from :func:`make_cache`); count the hits.

    ``with_next_use=True`` stamps every request with its next use (for Belady).
    """
    import libcachesim

    req = libcachesim.Request()
    req.obj_size = 1
    req.op = libcachesim.ReqOp.OP_READ
    next_use = next_use_positions(block_ids) if with_next_use else None
    hits = 0
    for i, block_id in enumerate(block_ids):
        req.obj_id = block_id
        req.clock_time = i
        if next_use is not None:
            req.next_access_vtime = next_use[i]
        hits += bool(cache.get(req))
    return hits


def libcachesim_hits_in_fresh_thread(
    make: Callable[[], Any], block_ids: Sequence[int], with_next_use: bool = False
) -> int:
    """:func:`libcachesim_hits` in a new thread: libCacheSim's random generator is
    thread-local and seeded when the thread starts, so randomised policies repeat exactly."""
    result: list[int] = []

    def replay() -> None:
        result.append(libcachesim_hits(make(), block_ids, with_next_use))

    thread = threading.Thread(target=replay)
    thread.start()
    thread.join()
    return result[0]


__all__ = [
    "NEVER",
    "libcachesim_hits",
    "libcachesim_hits_in_fresh_thread",
    "make_cache",
    "next_use_positions",
]
