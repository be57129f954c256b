"""LFUDA: LFU with dynamic aging (Arlitt et al., 2000), so that once-hot blocks can leave.

Each block has a priority ``K = uses + L``, recomputed at every use with the current cache age
``L``; the block with the lowest priority is evicted and ``L`` becomes its priority. New
blocks therefore start at ``L + 1``, level with old blocks whose counts were earned long ago,
and plain LFU's cache pollution by formerly popular blocks goes away. Among equal priorities
the block that reached its priority first is evicted (least recently used first, as in
``lfu``); a block that becomes evictable again (store or load completed) goes behind the
blocks of its priority.

Documented difference from libCacheSim 0.3.5 ``LFUDA``: there a use *adds the current
minimum priority* to the block's priority (``K += L`` instead of ``K = uses + L``), so uses
count for nothing until the first eviction and double a block's priority afterwards; with
small caches it also crashes or runs away (priorities grow exponentially and its minimum
search scans every integer up to the largest one). The tests show that a model of that rule
reproduces libCacheSim exactly while this module follows the published one.

Structure: evictable blocks sit in one insertion-ordered bucket per priority (order = when
they reached it), and a min-heap holds the buckets' priorities (an emptied bucket's priority is
dropped lazily), so the victim is the first block of the lowest bucket. Most blocks are never
reused and share the bucket ``L + 1``: an insert, a completion or an eviction is a dict
operation, and the heap moves only when a new priority appears. Pinned and pending blocks are
in no bucket, so eviction never looks at them. ``evict`` counts the eligible blocks before it
takes anything, so a failed call changes nothing.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import protected_disjoint, ready_keys


class LFUDACachePolicy(CachePolicy):
    """LFU with dynamic aging: evicts the lowest uses + cache-age priority, then ages the cache."""

    name = "lfuda"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        # (uses, priority) of every stored key: one tuple, so a store sets one shared value.
        self._state: dict[OffloadKey, tuple[int, int]] = {}
        self._age = 0  # L: the priority of the last victim
        # Evictable key -> the priority of the bucket that holds it (its priority when it
        # entered; an insert over a stored key may change the priority but not the bucket).
        self._live: dict[OffloadKey, int] = {}
        self._buckets: dict[int, OrderedDict[OffloadKey, None]] = {}  # none empty
        # Every bucket's priority, plus stale ones (of buckets emptied since): skipped when
        # they reach the top, dropped in bulk when they outnumber the buckets.
        self._bucket_heap: list[int] = []

    @property
    def cache_age(self) -> int:
        """``L``, the priority of the last evicted block (0 before the first eviction)."""
        return self._age

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        self._state[key] = (1, self._age + 1)
        if block.ref_cnt == 0:
            self._push(key)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        """The batch's entries in one update: every new key starts at (1, L + 1).

        Kept because it beats the base loop (``policy_cost.py --base-loops``; figures in
        ``docs/benchmarks.md``).
        """
        self._state.update(dict.fromkeys(keys, (1, self._age + 1)))
        for key in ready_keys(keys, blocks):
            self._push(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """Each key into its priority's bucket, the bucket looked up once per run of equal
        priorities (a request's stores share L + 1). Kept with :meth:`on_insert_many`."""
        blocks, state, live = self._blocks, self._state, self._live
        level = None
        bucket: OrderedDict[OffloadKey, None] = OrderedDict()
        for key in keys:
            if key in live or key not in blocks:
                continue
            wanted = state[key][1]
            if wanted != level:
                level = wanted
                bucket = self._bucket(level)
            live[key] = level
            bucket[key] = None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        del self._state[key]
        bucket = self._live.pop(key, None)
        if bucket is not None:
            self._leave(key, bucket)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Count one use of each ready block; walk tail to head so the head is most recent."""
        blocks, state, live = self._blocks, self._state, self._live
        walk = keys if isinstance(keys, (list, tuple)) else list(keys)
        if blocks.keys().isdisjoint(walk):  # a store's misses: nothing to count
            return
        for key in reversed(walk):
            status = blocks.get(key)
            if status is None or status.ref_cnt < 0:
                continue
            uses = state[key][0] + 1
            state[key] = (uses, uses + self._age)
            if key in live:
                self._push(key)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        live = self._live
        if n > len(live) - len(live.keys() & protected):
            return None
        buckets, heap = self._buckets, self._bucket_heap
        while heap[0] not in buckets:  # stale: that bucket emptied
            heapq.heappop(heap)
        lowest = heap[0]
        bucket = buckets[lowest]
        chosen = list(islice(bucket, n))
        if len(chosen) == n and (not protected or protected_disjoint(protected, chosen)):
            for key in chosen:  # the usual case: the n oldest blocks of the lowest bucket
                del bucket[key]
            if not bucket:
                del buckets[lowest]
            self._age = lowest
        else:
            chosen = []
            taken: list[int] = []  # the priorities popped off the heap, in order, once each
            while len(chosen) < n:
                level = heapq.heappop(heap)
                if level not in buckets or (taken and taken[-1] == level):
                    continue  # stale, or a repeat of the one just taken
                taken.append(level)
                for key in buckets[level]:
                    if key not in protected:
                        chosen.append(key)
                        if len(chosen) == n:
                            break
            self._age = taken[-1]
            for key in chosen:
                self._leave(key, live[key])
            for level in taken:
                if level in buckets:
                    heapq.heappush(heap, level)
        state = self._state
        for key in chosen:
            del live[key], state[key]
        return chosen

    def on_clear(self) -> None:
        for container in (self._state, self._live, self._buckets):
            container.clear()
        self._bucket_heap.clear()
        self._age = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks and key not in self._live:
            self._push(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        bucket = self._live.pop(key, None)
        if bucket is not None:
            self._leave(key, bucket)

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._blocks),
            "evictable": len(self._live),
            "cache_age": self._age,
        }

    def _push(self, key: OffloadKey) -> None:
        """Put ``key`` last in the bucket of its current priority (leaving any older one)."""
        live = self._live
        old = live.get(key)
        if old is not None:
            self._leave(key, old)
        level = live[key] = self._state[key][1]
        self._bucket(level)[key] = None

    def _bucket(self, level: int) -> OrderedDict[OffloadKey, None]:
        """The bucket of priority ``level``, created (and its priority pushed) if need be."""
        bucket = self._buckets.get(level)
        if bucket is None:
            bucket = self._buckets[level] = OrderedDict()
            heap = self._bucket_heap
            heapq.heappush(heap, level)
            if len(heap) > 2 * len(self._buckets) + 16:
                self._bucket_heap = list(self._buckets)
                heapq.heapify(self._bucket_heap)
        return bucket

    def _leave(self, key: OffloadKey, level: int) -> None:
        """Take ``key`` out of the bucket of priority ``level``; an emptied bucket goes."""
        bucket = self._buckets[level]
        del bucket[key]
        if not bucket:
            del self._buckets[level]
