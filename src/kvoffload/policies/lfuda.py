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

Structure: priorities are not adjacent (a use can jump far ahead), so the order is a binary
heap of ``(priority, arrival stamp, key)`` entries with lazy deletion: a use or a pin leaves
the old entry behind as stale, and the heap is rebuilt when stale entries outnumber live ones.
Operations cost O(log n) amortised; pinned and pending blocks have no live entry, so eviction
never looks at them. ``evict`` counts the eligible blocks before it pops anything, so a failed
call changes nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims

_HeapEntry = tuple[int, int, OffloadKey]  # (priority, arrival stamp, key)


class LFUDACachePolicy(CachePolicy):
    """LFU with dynamic aging: evicts the lowest uses + cache-age priority, then ages the cache."""

    name = "lfuda"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._uses: dict[OffloadKey, int] = {}
        self._priority: dict[OffloadKey, int] = {}
        self._age = 0  # L: the priority of the last victim
        self._heap: list[_HeapEntry] = []
        self._live_stamp: dict[OffloadKey, int] = {}  # evictable key -> its live entry's stamp
        self._next_stamp = 0

    @property
    def cache_age(self) -> int:
        """``L``, the priority of the last evicted block (0 before the first eviction)."""
        return self._age

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        self._blocks[key] = block
        self._uses[key] = 1
        self._priority[key] = self._age + 1
        if block.ref_cnt == 0:
            self._push(key)

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is not None:
            del self._uses[key], self._priority[key]
            self._live_stamp.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Count one use of each ready block; walk tail to head so the head is most recent."""
        blocks, uses, priority = self._blocks, self._uses, self._priority
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            status = blocks.get(key)
            if status is None or status.ref_cnt < 0:
                continue
            uses[key] += 1
            priority[key] = uses[key] + self._age
            if key in self._live_stamp:
                self._push(key)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        live = self._live_stamp
        if n > len(live) - len(live.keys() & protected):
            return None
        heap = self._heap
        chosen: list[_HeapEntry] = []
        passed: list[_HeapEntry] = []  # live but protected: they go back
        while len(chosen) < n:
            entry = heapq.heappop(heap)
            key = entry[2]
            if live.get(key) != entry[1]:
                continue  # stale: the block was used, pinned or removed since
            (passed if key in protected else chosen).append(entry)
        for entry in passed:
            heapq.heappush(heap, entry)
        self._age = chosen[-1][0]
        victims: Victims = []
        for _, _, key in chosen:
            del live[key], self._uses[key], self._priority[key]
            victims.append((key, self._blocks.pop(key)))
        return victims

    def clear(self) -> None:
        for container in (self._blocks, self._uses, self._priority, self._live_stamp):
            container.clear()
        self._heap.clear()
        self._age = 0
        self._next_stamp = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks and key not in self._live_stamp:
            self._push(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._live_stamp.pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._blocks),
            "evictable": len(self._live_stamp),
            "cache_age": self._age,
        }

    def _push(self, key: OffloadKey) -> None:
        """Give ``key`` a fresh live heap entry (any older one becomes stale)."""
        stamp = self._next_stamp
        self._next_stamp += 1
        self._live_stamp[key] = stamp
        heap = self._heap
        heapq.heappush(heap, (self._priority[key], stamp, key))
        if len(heap) > 2 * len(self._live_stamp) + 16:
            priority = self._priority
            self._heap = [(priority[k], s, k) for k, s in self._live_stamp.items()]
            heapq.heapify(self._heap)
