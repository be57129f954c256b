"""LIRS (Jiang & Zhang, SIGMETRICS'02): rank blocks by inter-reference recency, not recency.

Blocks whose last two uses were close together (low inter-reference recency) form the LIR set,
about ``1 - hir_ratio`` of the cache, and are never evicted directly. The other resident blocks
(HIR) sit in the FIFO queue Q and are the eviction candidates. The recency stack S orders LIR
blocks and recently seen HIR blocks (resident or not) by last use, and is pruned so its bottom
is always a LIR block. A HIR block used again while still in S has a shorter reuse distance
than the bottom LIR block: it becomes LIR and that bottom block is demoted to Q's tail. So a
scan of one-time blocks only churns Q, and a loop larger than the cache keeps its LIR part.

Parameters follow libCacheSim 0.3.5's defaults: Q holds ``max(1, int(hir_ratio * capacity))``
blocks, and S keeps at most ``stack_ratio * capacity`` entries by forgetting the non-resident
entries that became non-resident first.

Documented difference: libCacheSim's LIRS departs from the paper on a hit to a resident HIR
block that is not in S: it demotes a LIR block to Q there and then, and when Q is full it
*evicts* Q's front block on that hit (with Q limited to one block, below 200 blocks of capacity,
the evicted block can be the one being hit, which stays "resident" in S uncounted). A policy
here cannot evict on a hit (the manager owns the slots), and the paper leaves the LIR set
alone in that case, so this policy follows the paper; the test suite compares it with an
independent model of the paper and measures the gap to libCacheSim.

Pinning: eviction takes Q's first evictable, unprotected block; only when Q has none does it
fall back to the evictable LIR block nearest S's bottom. Pinned and pending blocks are not in
those orders. A block that becomes evictable again (store or load completed) counts as used:
a LIR block moves to S's top, a HIR block to Q's tail.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from itertools import islice

from kvoffload._checks import check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import protected_disjoint


class LIRSCachePolicy(CachePolicy):
    """LIRS (SIGMETRICS'02): ranks blocks by reuse distance, evicts from a small HIR queue."""

    name = "lirs"

    def __init__(
        self, cache_capacity: int, *, hir_ratio: float = 0.01, stack_ratio: float = 2.0
    ) -> None:
        super().__init__(cache_capacity)
        self.hir_ratio = check_number("hir_ratio", hir_ratio, 0.0, 1.0)
        self.stack_ratio = check_number("stack_ratio", stack_ratio, 1.0, 64.0)
        self._hir_limit = max(1, int(self.hir_ratio * cache_capacity)) if cache_capacity else 0
        self._lir_limit = cache_capacity - self._hir_limit
        self._stack_limit = int(self.stack_ratio * cache_capacity)
        self._lir: set[OffloadKey] = set()  # resident LIR blocks, pinned included
        self._stack: OrderedDict[OffloadKey, None] = OrderedDict()  # S, bottom first
        self._queue: OrderedDict[OffloadKey, None] = OrderedDict()  # evictable HIR, front first
        self._lir_order: OrderedDict[OffloadKey, None] = OrderedDict()  # evictable LIR, S order
        self._ghosts: OrderedDict[OffloadKey, None] = OrderedDict()  # non-resident S entries

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        evictable = block.ref_cnt == 0
        if self._ghosts.pop(key, 0) is None:  # seen recently enough: its reuse distance is short
            self._stack.move_to_end(key)
            self._make_lir(key, evictable)
        else:
            self._stack[key] = None
            if len(self._lir) < self._lir_limit:
                self._lir.add(key)
                if evictable:
                    self._lir_order[key] = None
            else:
                if evictable:
                    self._queue[key] = None
                self._prune()  # no LIR block below it (no LIR set at all): S keeps nothing
        while len(self._stack) > self._stack_limit and self._ghosts:
            del self._stack[self._ghosts.popitem(last=False)[0]]

    def _make_lir(self, key: OffloadKey, evictable: bool) -> None:
        """``key`` (at S's top) joins the LIR set; the set's surplus goes to Q's tail."""
        self._lir.add(key)
        if evictable:
            self._lir_order[key] = None
        while len(self._lir) > self._lir_limit:
            self._prune()
            bottom = next(iter(self._stack))  # pruned: a LIR block (every LIR block is in S)
            self._lir.discard(bottom)
            del self._stack[bottom]
            if self._lir_order.pop(bottom, 0) is None:
                self._queue[bottom] = None
        self._prune()

    def _prune(self) -> None:
        """Drop HIR entries from S's bottom until a LIR block is there."""
        stack, lir, ghosts = self._stack, self._lir, self._ghosts
        while stack:
            bottom = next(iter(stack))
            if bottom in lir:
                return
            del stack[bottom]
            ghosts.pop(bottom, None)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        if key in self._lir:
            self._lir.discard(key)
            self._lir_order.pop(key, None)
            del self._stack[key]
            self._prune()
        else:
            self._queue.pop(key, None)
            self._stack.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        walk = keys if isinstance(keys, (list, tuple)) else list(keys)
        if self._blocks.keys().isdisjoint(walk) and self._ghosts.keys().isdisjoint(walk):
            return  # unknown misses (most of a store's keys): nothing to record
        for key in reversed(walk):
            if key in self._lir:
                self._stack.move_to_end(key)
                if key in self._lir_order:
                    self._lir_order.move_to_end(key)
                self._prune()
            elif key in self._blocks:
                if key in self._stack:  # resident HIR re-used within S: becomes LIR
                    self._stack.move_to_end(key)
                    evictable = self._queue.pop(key, 0) is None
                    self._make_lir(key, evictable)
                else:
                    self._stack[key] = None
                    self._prune()
                    if key in self._queue:
                        self._queue.move_to_end(key)
            elif key in self._ghosts:  # a miss that the following insert turns into LIR
                self._stack.move_to_end(key)
                self._ghosts.move_to_end(key)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if n > len(self._queue) + len(self._lir_order):
            return None
        chosen_hir: list[OffloadKey] = list(islice(self._queue, n))
        chosen_lir: list[OffloadKey] = []
        if len(chosen_hir) == n and (not protected or protected_disjoint(protected, chosen_hir)):
            pass  # the usual case: Q's n oldest blocks
        else:
            chosen_hir = []
            self._choose(n, protected, chosen_hir, chosen_lir)
            if len(chosen_hir) + len(chosen_lir) < n:
                return None
        queue, stack, ghosts = self._queue, self._stack, self._ghosts
        for key in chosen_hir:
            del queue[key]
            if key in stack:
                ghosts[key] = None
        for key in chosen_lir:
            del self._lir_order[key]
            self._lir.discard(key)
            del self._stack[key]
        if chosen_lir:
            self._prune()
        return chosen_hir + chosen_lir

    def _choose(
        self,
        n: int,
        protected: Collection[OffloadKey],
        chosen_hir: list[OffloadKey],
        chosen_lir: list[OffloadKey],
    ) -> None:
        """Q's unprotected blocks, oldest first, then the LIR blocks', up to ``n`` in all."""
        for order, chosen in ((self._queue, chosen_hir), (self._lir_order, chosen_lir)):
            for key in order:
                if len(chosen_hir) + len(chosen_lir) == n:
                    break
                if key not in protected:
                    chosen.append(key)

    def on_clear(self) -> None:
        for container in (
            self._lir,
            self._stack,
            self._queue,
            self._lir_order,
            self._ghosts,
        ):
            container.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._lir:
            self._stack.move_to_end(key)
            self._lir_order[key] = None
            self._lir_order.move_to_end(key)
            self._prune()
        elif key in self._blocks:
            self._queue[key] = None
            self._queue.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._lir_order.pop(key, None)
        self._queue.pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "lir_size": len(self._lir),
            "hir_resident": len(self._blocks) - len(self._lir),
            "stack_size": len(self._stack),
            "nonresident_in_stack": len(self._ghosts),
            "evictable": len(self._queue) + len(self._lir_order),
        }
