"""ARC (Megiddo & Modha, FAST'03), adapted to pinned and pending blocks.

T1 holds blocks seen once recently, T2 blocks seen at least twice; ghost lists B1 / B2 remember
keys recently evicted from each, and the real-valued target ``p`` for |T1| moves toward
whichever list's ghosts are being hit. Driven one block at a time with no pinning (the
protocol in :mod:`kvoffload.policies.base`) it makes exactly the FAST'03 decisions:

* hit: ``touch`` moves the block to T2's MRU end;
* ghost hit: ``touch`` adapts ``p``; ``evict`` runs REPLACE (it sees the missed key in
  ``protected`` for the "x in B2 and |T1| = p" case); ``insert`` puts the key in T2;
* new key: ``evict`` runs REPLACE; ``insert`` puts the key in T1; ghosts are then trimmed so
  that |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, which is the paper's case IV
  bookkeeping (including "|T1| = c: drop T1's LRU with no ghost").

Pinning: list sizes count every resident block, but the recency order used for eviction
holds only evictable blocks (per list), so eviction never scans pinned ones. A block that
becomes evictable again enters its list's order at the MRU end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims


def _next_unprotected(
    it: Iterator[OffloadKey], protected: Collection[OffloadKey]
) -> OffloadKey | None:
    for key in it:
        if key not in protected:
            return key
    return None


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache (FAST'03): balances recency and frequency with ghost lists."""

    name = "arc"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._t1: dict[OffloadKey, BlockStatus] = {}
        self._t2: dict[OffloadKey, BlockStatus] = {}
        self._t1_order: OrderedDict[OffloadKey, None] = OrderedDict()  # evictable, LRU first
        self._t2_order: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()  # ghosts, LRU first
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._p = 0.0

    @property
    def target_t1_size(self) -> float:
        """The adaptive target ``p`` for |T1|."""
        return self._p

    def get(self, key: OffloadKey) -> BlockStatus | None:
        status = self._t1.get(key)
        return status if status is not None else self._t2.get(key)

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        if key in self._b1:
            del self._b1[key]
            self._t2[key] = block
            order = self._t2_order
        elif key in self._b2:
            del self._b2[key]
            self._t2[key] = block
            order = self._t2_order
        else:
            self._t1[key] = block
            order = self._t1_order
        if block.ref_cnt == 0:
            order[key] = None
        self._trim_ghosts()

    def remove(self, key: OffloadKey) -> None:
        if self._t1.pop(key, None) is not None:
            self._t1_order.pop(key, None)
        elif self._t2.pop(key, None) is not None:
            self._t2_order.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        t1, t2 = self._t1, self._t2
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            status = t1.get(key)
            if status is not None:
                if status.ref_cnt >= 0:  # ready: a second access promotes to T2
                    del t1[key]
                    t2[key] = status
                    if self._t1_order.pop(key, 0) is None:
                        self._t2_order[key] = None
                continue
            if key in t2:
                if key in self._t2_order:
                    self._t2_order.move_to_end(key)
                continue
            b1, b2 = len(self._b1), len(self._b2)
            if key in self._b1:
                self._p = min(float(self.cache_capacity), self._p + max(b2 / b1, 1.0))
            elif key in self._b2:
                self._p = max(0.0, self._p - max(b1 / b2, 1.0))

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        if n > len(self._t1_order) + len(self._t2_order):
            return None
        missed_in_b2 = any(key in self._b2 for key in protected)
        t1_iter = iter(self._t1_order)
        t2_iter = iter(self._t2_order)
        t1_size = len(self._t1)
        p = self._p
        from_t1: list[OffloadKey] = []
        from_t2: list[OffloadKey] = []
        for _ in range(n):
            prefer_t1 = t1_size >= 1 and (t1_size > p or (missed_in_b2 and t1_size == p))
            key = _next_unprotected(t1_iter, protected) if prefer_t1 else None
            if key is not None:
                from_t1.append(key)
                t1_size -= 1
                continue
            key = _next_unprotected(t2_iter, protected)
            if key is not None:
                from_t2.append(key)
                continue
            if not prefer_t1:
                key = _next_unprotected(t1_iter, protected)
                if key is not None:
                    from_t1.append(key)
                    t1_size -= 1
                    continue
            return None
        victims: Victims = []
        for key in from_t1:
            del self._t1_order[key]
            victims.append((key, self._t1.pop(key)))
            self._b1[key] = None
        for key in from_t2:
            del self._t2_order[key]
            victims.append((key, self._t2.pop(key)))
            self._b2[key] = None
        self._trim_ghosts()
        return victims

    def _trim_ghosts(self) -> None:
        capacity = self.cache_capacity
        b1, b2 = self._b1, self._b2
        excess = len(self._t1) + len(b1) - capacity
        while excess > 0 and b1:
            b1.popitem(last=False)
            excess -= 1
        excess = len(self._t1) + len(self._t2) + len(b1) + len(b2) - 2 * capacity
        while excess > 0 and b2:
            b2.popitem(last=False)
            excess -= 1
        while excess > 0 and b1:  # only reachable when T2 alone outgrew 2c - |T1| (pins)
            b1.popitem(last=False)
            excess -= 1

    def clear(self) -> None:
        for container in (self._t1, self._t2, self._t1_order, self._t2_order, self._b1, self._b2):
            container.clear()
        self._p = 0.0

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._t1:
            self._t1_order[key] = None
            self._t1_order.move_to_end(key)
        elif key in self._t2:
            self._t2_order[key] = None
            self._t2_order.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if self._t1_order.pop(key, 0) != 0:
            return
        self._t2_order.pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "target_t1_size": self._p,
            "t1_size": len(self._t1),
            "t2_size": len(self._t2),
            "b1_size": len(self._b1),
            "b2_size": len(self._b2),
        }
