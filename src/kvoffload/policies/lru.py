"""LRU: evict the ready block whose last use is oldest.

Only evictable blocks (``ref_cnt == 0``) live in the recency order, kept current by the mark
hooks, so eviction never scans pinned or pending blocks: O(1) per operation plus the protected
keys it has to step over. A block re-entering the order (store or load completed) becomes most
recent: finishing a load is a use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims
from kvoffload.policies.victims import append_absent, protected_disjoint, ref_count


class LRUCachePolicy(CachePolicy):
    """Least recently used: evicts the ready block whose last use is oldest."""

    name = "lru"
    touches_misses = False

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        # Evictable keys, least recent first.
        self._evictable: OrderedDict[OffloadKey, None] = OrderedDict()

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    @property
    def block_table(self) -> Mapping[OffloadKey, BlockStatus]:
        return self._blocks

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        self._blocks[key] = block
        if block.ref_cnt == 0:
            self._evictable[key] = None

    def insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        if type(self).insert is not LRUCachePolicy.insert:  # a subclass hooks insert: honour it
            super().insert_many(keys, blocks, req_context)
            return
        if len(keys) == 1:
            key, block = keys[0], blocks[0]
            self._blocks[key] = block
            if block.ref_cnt == 0:
                self._evictable[key] = None
                self._evictable.move_to_end(key)
            return
        self._blocks.update(zip(keys, blocks, strict=True))
        if 0 in map(ref_count, blocks):  # usually none: the manager inserts pending blocks
            pairs = zip(keys, blocks, strict=True)
            self.mark_evictable_many([key for key, block in pairs if block.ref_cnt == 0])

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        if type(self).mark_evictable is not LRUCachePolicy.mark_evictable:  # a subclass hook
            super().mark_evictable_many(keys)
            return
        evictable = self._evictable
        blocks = self._blocks
        if len(keys) == 1:
            self.mark_evictable(keys[0])
            return
        if evictable.keys().isdisjoint(keys) and all(map(blocks.__contains__, keys)):
            append_absent(evictable, keys)  # the usual case: new entries land at the end
            return
        for key in keys:
            if key in blocks:
                evictable[key] = None
                evictable.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is not None:
            self._evictable.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        evictable = self._evictable
        move = evictable.move_to_end
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            if key in evictable:
                move(key)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        evictable = self._evictable
        if n > len(evictable):
            return None
        if n == 1:
            for key in evictable:
                if key not in protected:
                    del evictable[key]
                    return [(key, self._blocks.pop(key))]
            return None
        chosen = list(islice(evictable, n))  # the n least recent: the usual answer
        if not protected or protected_disjoint(protected, chosen):
            for key in chosen:  # (a del loop beats popitem and map(pop) here)
                del evictable[key]
        else:
            chosen = []
            for key in evictable:
                if key not in protected:
                    chosen.append(key)
                    if len(chosen) == n:
                        break
            else:
                return None
            for key in chosen:
                del evictable[key]
        return list(zip(chosen, map(self._blocks.pop, chosen), strict=True))

    def clear(self) -> None:
        self._blocks.clear()
        self._evictable.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks:
            self._evictable[key] = None
            self._evictable.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {"blocks": len(self._blocks), "evictable": len(self._evictable)}
