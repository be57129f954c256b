"""FIFO: evict the ready block that was stored earliest; uses never change the order.

A block's place in the queue is fixed when it is inserted. A block that is pinned (being
loaded) or pending (being written) keeps its place, so that loads do not turn FIFO into LRU;
eviction therefore steps over the pinned, pending and protected blocks it meets at the old end
of the queue. Their number is bounded by the blocks in flight, and pending blocks are the
newest ones, so in practice eviction only steps over blocks that are being loaded. Everything
else is O(1) per operation. Driven one block at a time without pins it makes exactly
libCacheSim's ``FIFO`` decisions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.evictable_set import EvictableSetPolicy


class FIFOCachePolicy(EvictableSetPolicy):
    """First in, first out: evicts the ready block that was stored earliest."""

    name = "fifo"

    # self._blocks (the base's table, a dict) keeps insertion order: oldest first.

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Uses do not matter to FIFO."""

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if not self._can_evict(n, protected):
            return None
        evictable = self._evictable
        chosen: list[OffloadKey] = []
        for key in self._blocks:
            if key in evictable and key not in protected:
                chosen.append(key)
                if len(chosen) == n:
                    break
        evictable.difference_update(chosen)
        return chosen
