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

from collections.abc import Collection, Iterable, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims, already_stored


class FIFOCachePolicy(CachePolicy):
    """First in, first out: evicts the ready block that was stored earliest."""

    name = "fifo"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # self._blocks (the base's table, a dict) keeps insertion order: oldest first.
        self._evictable: set[OffloadKey] = set()

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        if key in self._blocks:
            raise already_stored(key)
        self._blocks[key] = block
        if block.ref_cnt == 0:
            self._evictable.add(key)

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is not None:
            self._evictable.discard(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Uses do not matter to FIFO."""

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        evictable = self._evictable
        if n > len(evictable) - len(evictable.intersection(protected)):
            return None
        chosen: list[OffloadKey] = []
        for key in self._blocks:
            if key in evictable and key not in protected:
                chosen.append(key)
                if len(chosen) == n:
                    break
        victims: Victims = []
        for key in chosen:
            evictable.remove(key)
            victims.append((key, self._blocks.pop(key)))
        return victims

    def clear(self) -> None:
        self._blocks.clear()
        self._evictable.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks:
            self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    def stats(self) -> Mapping[str, float]:
        return {"blocks": len(self._blocks), "evictable": len(self._evictable)}
