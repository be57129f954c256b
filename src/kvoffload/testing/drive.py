"""Drive a policy one block at a time with the manager's protocol (no pinning).

This is the protocol under which our policies are compared with libCacheSim: each access is
a lookup; a hit is touched; a miss is touched (ghost learning), makes room with
``evict(1, {key})`` when the cache is full, is inserted as being written and then completed.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.keys import int_key  # re-exported: policy tests import it from here
from kvoffload.policies.base import BlockStatus, CachePolicy


def drive_single_blocks(policy: CachePolicy, block_ids: Iterable[int]) -> int:
    """Replay ``block_ids`` through ``policy``; return the number of hits.

    Capacity is ``policy.cache_capacity`` blocks. A capacity of 0 stores nothing.
    """
    capacity = policy.cache_capacity
    free_slots = list(range(capacity - 1, -1, -1))
    hits = 0
    get, touch, evict, insert = policy.get, policy.touch, policy.evict, policy.insert
    mark_evictable = policy.mark_evictable
    for block_id in block_ids:
        key = int_key(block_id)
        one = [key]
        if get(key) is not None:
            hits += 1
            touch(one)
            continue
        touch(one)
        if capacity == 0:
            continue
        if not free_slots:
            victims = evict(1, one)
            if not victims:
                raise AssertionError(f"{type(policy).__name__} failed to evict from a full cache")
            free_slots.extend(status.block_id for _, status in victims)
        status = BlockStatus(free_slots.pop(), -1)
        insert(key, status)
        status.ref_cnt = 0
        mark_evictable(key)
    return hits


__all__ = ["drive_single_blocks", "int_key"]
