"""Drive a policy one block at a time with the manager's protocol (no pinning).

This is the protocol under which our policies are compared with libCacheSim: each access is
a lookup; a hit is touched; a miss is touched (ghost learning), makes room with
``evict(1, {key})`` when the cache is full, is inserted as being written and then completed.
The accesses are the block ledger's (:meth:`~kvoffload.manager.ledger.BlockLedger.access_each`
without a request and without pins), the same code the simulator's blocks mode runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.keys import int_key  # re-exported: policy tests import it from here
from kvoffload.manager.ledger import BlockLedger
from kvoffload.policies.base import CachePolicy


def drive_single_blocks(policy: CachePolicy, block_ids: Iterable[int]) -> int:
    """Replay ``block_ids`` through ``policy``; return the number of hits.

    Capacity is ``policy.cache_capacity`` blocks. A capacity of 0 stores nothing.
    """
    capacity = policy.cache_capacity
    ledger = BlockLedger(policy, capacity)
    out = ledger.access_each(map(int_key, block_ids), None, pin_hits=False, touch_misses=True)
    if out.failed and capacity:
        raise AssertionError(f"{type(policy).__name__} failed to evict from a full cache")
    return out.hits


__all__ = ["drive_single_blocks", "int_key"]
