"""LRU: evict the ready block whose last use is oldest.

Only evictable blocks (``ref_cnt == 0``) live in the recency order, kept current by the mark
hooks, so eviction never scans pinned or pending blocks: O(1) per operation plus the protected
keys it has to step over. A block re-entering the order (store or load completed) becomes most
recent: finishing a load is a use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import append_absent, protected_disjoint, ready_keys


class LRUCachePolicy(CachePolicy):
    """Least recently used: evicts the ready block whose last use is oldest."""

    name = "lru"
    touches_misses = False

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # Evictable keys, least recent first.
        self._evictable: OrderedDict[OffloadKey, None] = OrderedDict()

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        if block.ref_cnt == 0:
            self._evictable[key] = None

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        """One pass for the batch (the manager stores a request's misses at once).

        Kept although its gain over the base loop is below the 10% the batching rule asks:
        with :meth:`mark_evictable_many` it saves a steady share of the manager's prefix
        replay, timed (``policy_cost.py --base-loops``) and counted in instructions
        (``tools/ab_instructions.py``); figures in ``docs/benchmarks.md``.
        """
        evictable = self._evictable
        for key in ready_keys(keys, blocks):
            evictable[key] = None

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """New entries appended in one pass (completed stores and loads, the usual case);
        kept with :meth:`on_insert_many` (see there)."""
        evictable = self._evictable
        if evictable.keys().isdisjoint(keys) and all(map(self._blocks.__contains__, keys)):
            append_absent(evictable, keys)
            return
        mark_evictable = self.mark_evictable
        for key in keys:
            mark_evictable(key)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._evictable.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        evictable = self._evictable
        move = evictable.move_to_end
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            if key in evictable:
                move(key)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        evictable = self._evictable
        if n > len(evictable):
            return None
        if n == 1:
            for key in evictable:
                if key not in protected:
                    del evictable[key]
                    return [key]
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
        return chosen

    def on_clear(self) -> None:
        self._evictable.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        evictable = self._evictable
        if key in evictable:  # already ready (a load finished): a use
            evictable.move_to_end(key)
        elif key in self._blocks:  # the usual case: a new entry lands at the end
            evictable[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._evictable.pop(key, None)

    def eviction_order(self) -> Iterator[OffloadKey]:
        """The evictable keys, least recent (the next victim) first: for a subclass that picks
        its own victims (take them with ``get`` and ``remove``). Do not store while iterating."""
        return iter(self._evictable)

    def stats(self) -> Mapping[str, float]:
        return {"blocks": len(self._blocks), "evictable": len(self._evictable)}
