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

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import (
    append_absent,
    next_unprotected,
    protected_disjoint,
    ready_keys,
)


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache (FAST'03): balances recency and frequency with ghost lists."""

    name = "arc"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._t2: set[OffloadKey] = set()  # T1 = stored keys not in T2
        self._t1_order: OrderedDict[OffloadKey, None] = OrderedDict()  # evictable, LRU first
        self._t2_order: OrderedDict[OffloadKey, None] = OrderedDict()
        self._b1: OrderedDict[OffloadKey, None] = OrderedDict()  # ghosts, LRU first
        self._b2: OrderedDict[OffloadKey, None] = OrderedDict()
        self._p = 0.0

    @property
    def target_t1_size(self) -> float:
        """The adaptive target ``p`` for |T1|."""
        return self._p

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        self._order_one(key, block)
        self._trim_ghosts(len(self._blocks))

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        b1, b2 = self._b1, self._b2
        if (b1 and not b1.keys().isdisjoint(keys)) or (b2 and not b2.keys().isdisjoint(keys)):
            # A ghost hit in the batch: trimming between inserts may drop a later key's ghost,
            # so go one insert at a time, exactly as single calls would (each trim counting
            # the blocks stored up to its key).
            stored = len(self._blocks) - len(keys)
            for key, block in zip(keys, blocks, strict=True):
                stored += 1
                self._order_one(key, block)
                self._trim_ghosts(stored)
            return
        # Only new keys: all go to T1, and one trim at the end drops what per-insert trims
        # would have dropped (|T1| only grows, ghosts only shrink, both from their LRU ends).
        t1_order = self._t1_order
        for key in ready_keys(keys, blocks):  # (setitems beat .update)
            t1_order[key] = None
        self._trim_ghosts(len(self._blocks))

    def _order_one(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._b1:
            del self._b1[key]
        elif key in self._b2:
            del self._b2[key]
        else:
            if block.ref_cnt == 0:
                self._t1_order[key] = None
            return
        self._t2.add(key)  # a ghost hit comes back into T2
        if block.ref_cnt == 0:
            self._t2_order[key] = None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._t2:
            self._t2.discard(key)
            self._t2_order.pop(key, None)
        else:
            self._t1_order.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        blocks, t2 = self._blocks, self._t2
        t1_order, t2_order = self._t1_order, self._t2_order
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        if (
            blocks.keys().isdisjoint(keys)
            and self._b1.keys().isdisjoint(keys)
            and self._b2.keys().isdisjoint(keys)
        ):
            return  # only brand-new keys (the usual store): nothing to learn, C-level check
        for key in reversed(keys):
            status = blocks.get(key)
            if status is not None:
                if key in t2:
                    if key in t2_order:
                        t2_order.move_to_end(key)
                elif status.ref_cnt >= 0:  # ready in T1: a second access promotes to T2
                    t2.add(key)
                    if t1_order.pop(key, 0) is None:
                        t2_order[key] = None
                continue
            if key in self._b1:
                b1, b2 = len(self._b1), len(self._b2)
                self._p = min(float(self.cache_capacity), self._p + max(b2 / b1, 1.0))
            elif key in self._b2:
                b1, b2 = len(self._b1), len(self._b2)
                self._p = max(0.0, self._p - max(b1 / b2, 1.0))

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        t1_order, t2_order = self._t1_order, self._t2_order
        if n > len(t1_order) + len(t2_order):
            return None
        missed_in_b2 = not self._b2.keys().isdisjoint(protected) if self._b2 else False
        chosen = None if n == 1 else self._plan_without_protection(n, missed_in_b2)
        if chosen is not None and protected_disjoint(protected, chosen[0] + chosen[1]):
            from_t1, from_t2 = chosen
        else:
            plan = self._plan(n, protected, missed_in_b2)
            if plan is None:
                return None
            from_t1, from_t2 = plan
        if from_t1:
            for key in from_t1:
                del t1_order[key]
            b1 = self._b1
            for key in from_t1:
                b1[key] = None
        if from_t2:
            for key in from_t2:
                del t2_order[key]
            self._t2.difference_update(from_t2)
            b2 = self._b2
            for key in from_t2:
                b2[key] = None
            from_t1 += from_t2
        self._trim_ghosts(len(self._blocks) - n)  # the base drops the victims after this
        return from_t1

    def _plan_without_protection(
        self, n: int, missed_in_b2: bool
    ) -> tuple[list[OffloadKey], list[OffloadKey]] | None:
        """REPLACE's n choices when nothing stands in the way (None if a list runs dry).

        REPLACE takes T1's LRU while |T1| > p (or |T1| = p when the missed key is in B2), and
        |T1| only shrinks as it does, so the number taken from T1 has a closed form.
        """
        t1_size = len(self._blocks) - len(self._t2)
        p = self._p
        floor_p = math.floor(p)
        take_t1 = max(0, t1_size - floor_p)
        if missed_in_b2 and p == floor_p and 1 <= p <= t1_size:
            take_t1 += 1
        take_t1 = min(n, take_t1)
        if take_t1 > len(self._t1_order) or n - take_t1 > len(self._t2_order):
            return None
        return list(islice(self._t1_order, take_t1)), list(islice(self._t2_order, n - take_t1))

    def _plan(
        self, n: int, protected: Collection[OffloadKey], missed_in_b2: bool
    ) -> tuple[list[OffloadKey], list[OffloadKey]] | None:
        """REPLACE's n choices, stepping over protected keys and empty lists (no mutation)."""
        t1_iter = iter(self._t1_order)
        t2_iter = iter(self._t2_order)
        t1_size = len(self._blocks) - len(self._t2)
        p = self._p
        from_t1: list[OffloadKey] = []
        from_t2: list[OffloadKey] = []
        for _ in range(n):
            if t1_size >= 1 and (t1_size > p or (missed_in_b2 and t1_size == p)):
                key = next_unprotected(t1_iter, protected)
                if key is not None:
                    from_t1.append(key)
                    t1_size -= 1
                    continue
                key = next_unprotected(t2_iter, protected)
                if key is None:
                    return None
                from_t2.append(key)
                continue
            key = next_unprotected(t2_iter, protected)
            if key is not None:
                from_t2.append(key)
                continue
            key = next_unprotected(t1_iter, protected)
            if key is None:
                return None
            from_t1.append(key)
            t1_size -= 1
        return from_t1, from_t2

    def _trim_ghosts(self, stored: int) -> None:
        """Keep |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c (FAST'03 case IV), with
        ``stored`` blocks (T1 + T2) stored."""
        capacity = self.cache_capacity
        b1, b2 = self._b1, self._b2
        excess = stored - len(self._t2) + len(b1) - capacity
        if excess > 0:
            pop1 = b1.popitem
            for _ in range(min(excess, len(b1))):
                pop1(False)
        excess = stored + len(b1) + len(b2) - 2 * capacity
        if excess > 0:
            dropped = min(excess, len(b2))
            pop2 = b2.popitem
            for _ in range(dropped):
                pop2(False)
            pop1 = b1.popitem
            for _ in range(min(excess - dropped, len(b1))):  # only when pins let T2 outgrow
                pop1(False)

    def on_clear(self) -> None:
        for container in (
            self._t2,
            self._t1_order,
            self._t2_order,
            self._b1,
            self._b2,
        ):
            container.clear()
        self._p = 0.0

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks:
            order = self._t2_order if key in self._t2 else self._t1_order
            order[key] = None
            order.move_to_end(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        blocks, t2 = self._blocks, self._t2
        t1_order, t2_order = self._t1_order, self._t2_order
        if (
            t2.isdisjoint(keys)
            and t1_order.keys().isdisjoint(keys)
            and all(map(blocks.__contains__, keys))
        ):
            append_absent(t1_order, keys)  # the usual case: fresh T1 blocks land at the end
            return
        for key in keys:
            if key in blocks:
                order = t2_order if key in t2 else t1_order
                order[key] = None
                order.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if self._t1_order.pop(key, 0) != 0:
            return
        self._t2_order.pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "target_t1_size": self._p,
            "t1_size": len(self._blocks) - len(self._t2),
            "t2_size": len(self._t2),
            "b1_size": len(self._b1),
            "b2_size": len(self._b2),
        }
