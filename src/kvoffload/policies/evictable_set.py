"""The base of policies whose order ignores pins: FIFO, CLOCK and SIEVE.

Why: their queue or ring keeps pinned and pending blocks in place (a load must not reorder
FIFO), so eviction steps over them; what it needs is the set of ready, unpinned keys. This
base keeps that set in step with the manager's mark hooks, once for all three.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy


class EvictableSetPolicy(CachePolicy):
    """A :class:`CachePolicy` that tracks its evictable keys in ``self._evictable``."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._evictable: set[OffloadKey] = set()

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        if block.ref_cnt == 0:
            self._evictable.add(key)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._evictable.discard(key)

    def _can_evict(self, n: int, protected: Collection[OffloadKey]) -> bool:
        """Whether ``n`` blocks outside ``protected`` are evictable (``evict``'s precheck)."""
        evictable = self._evictable
        return n <= len(evictable) - len(evictable.intersection(protected))

    def on_clear(self) -> None:
        self._evictable.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks:
            self._evictable.add(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.discard(key)

    def stats(self) -> Mapping[str, float]:
        return {"blocks": len(self._blocks), "evictable": len(self._evictable)}


__all__ = ["EvictableSetPolicy"]
