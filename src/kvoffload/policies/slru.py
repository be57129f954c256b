"""Segmented LRU (Karedla, Love & Wherry 1994), generalised to n segments (S4LRU and the like).

Segment 0 is probation; segments 1..n-1 are protected levels. A new block enters probation; a
hit moves a block up one level (a hit on the top level refreshes it there). A level that
outgrows its share pushes its LRU block down to the MRU end of the level below, cascading to
probation. Eviction takes the LRU block of the lowest non-empty level, so a block must be
re-used to survive a scan of one-time blocks.

Sizes: the protected levels share ``int(capacity * protected_ratio)`` blocks equally
(``int(capacity * protected_ratio / (n - 1))`` each); probation gets the rest.
``num_segments=2, protected_ratio=0.8`` is the classic 20/80 SLRU; ``num_segments=4,
protected_ratio=0.75`` is S4LRU (Huang et al., SOSP'13), libCacheSim 0.3.5's ``SLRU``.

``fill_free_segments=True`` places a new block in the lowest level that still has room (only
possible while the cache fills up), which is what libCacheSim does; the published SLRU always
inserts into probation. With it, driven one block at a time without pins, this policy makes
exactly libCacheSim's ``SLRU`` decisions whenever the capacity is a multiple of 4.

Documented difference (other capacities): libCacheSim gives every level ``int(capacity / 4)``
and lets probation overflow into the remaining ``capacity % 4`` slots, but a promotion cascade
that finds probation over its share then evicts blocks *on a hit*. A policy here cannot evict
on a hit (the manager owns the slots), so probation's share simply includes the remainder.

Pinned and pending blocks are not in the eviction orders; they count toward their level's
size. A block that becomes evictable again (store or load completed) re-enters its level at
the MRU end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping

from kvoffload._checks import check_bool, check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import first_unprotected


def segment_limits(capacity: int, num_segments: int, protected_ratio: float) -> list[int]:
    """Per-level capacity, probation first: protected levels equal, probation the remainder."""
    each = int(capacity * protected_ratio / (num_segments - 1)) if num_segments > 1 else 0
    return [capacity - each * (num_segments - 1)] + [each] * (num_segments - 1)


class SLRUCachePolicy(CachePolicy):
    """Segmented LRU: blocks climb from probation through protected levels by being re-used."""

    name = "slru"

    def __init__(
        self,
        cache_capacity: int,
        *,
        protected_ratio: float = 0.8,
        num_segments: int = 2,
        fill_free_segments: bool = False,
    ) -> None:
        super().__init__(cache_capacity)
        check_int("num_segments", num_segments, 2, 64, why=" (probation plus protected levels)")
        check_number(
            "protected_ratio", protected_ratio, 0, 1, high_open=True, why=" (probation needs room)"
        )
        check_bool("fill_free_segments", fill_free_segments)
        self.protected_ratio = float(protected_ratio)
        self.num_segments = num_segments
        self.fill_free_segments = fill_free_segments
        self._limits = segment_limits(cache_capacity, num_segments, self.protected_ratio)
        self._level: dict[OffloadKey, int] = {}
        self._sizes = [0] * num_segments  # resident blocks per level, pinned included
        # Evictable blocks per level, LRU first.
        self._orders: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(num_segments)
        ]

    @property
    def segment_sizes(self) -> tuple[int, ...]:
        """Resident blocks per level, probation first (pinned blocks included)."""
        return tuple(self._sizes)

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        level = 0
        if self.fill_free_segments:
            for i, (size, limit) in enumerate(zip(self._sizes, self._limits, strict=True)):
                if size < limit:
                    level = i
                    break
        self._level[key] = level
        self._sizes[level] += 1
        if block.ref_cnt == 0:
            self._orders[level][key] = None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        level = self._level.pop(key)
        self._sizes[level] -= 1
        self._orders[level].pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        top = self.num_segments - 1
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            level = self._level.get(key)
            if level is None:
                continue
            if level == top:
                if key in self._orders[top]:
                    self._orders[top].move_to_end(key)
                continue
            self._move(key, level, level + 1)
            self._cool(level + 1)

    def _move(self, key: OffloadKey, src: int, dst: int) -> None:
        self._sizes[src] -= 1
        self._sizes[dst] += 1
        self._level[key] = dst
        if self._orders[src].pop(key, 0) is None:
            self._orders[dst][key] = None

    def _cool(self, level: int) -> None:
        """Push LRU blocks down from ``level`` while levels above probation are over share."""
        while level > 0 and self._sizes[level] > self._limits[level]:
            order = self._orders[level]
            if not order:  # only pinned blocks left up here: let the level run over
                return
            self._move(next(iter(order)), level, level - 1)
            level -= 1

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = first_unprotected(self._orders, n, protected)
        if chosen is None:
            return None
        for key in chosen:
            level = self._level.pop(key)
            self._sizes[level] -= 1
            del self._orders[level][key]
        return chosen

    def on_clear(self) -> None:
        self._level.clear()
        self._sizes = [0] * self.num_segments
        for order in self._orders:
            order.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        level = self._level.get(key)
        if level is not None:
            order = self._orders[level]
            order[key] = None
            order.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        level = self._level.get(key)
        if level is not None:
            self._orders[level].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        stats: dict[str, float] = {f"segment{i}_size": s for i, s in enumerate(self._sizes)}
        stats["evictable"] = sum(len(order) for order in self._orders)
        return stats
