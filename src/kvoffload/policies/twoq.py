"""2Q (Johnson & Shasha, VLDB'94), the full version: A1in FIFO, A1out ghosts, Am LRU.

A block seen for the first time enters A1in, a FIFO: a burst of correlated re-uses right after
the first one does not make a block "hot". When A1in holds more than its share it gives up its
oldest block, whose key is remembered in the ghost FIFO A1out. A miss on a key still in A1out
shows a real re-use at a longer distance: the block is stored straight into Am, an LRU. Hits in
A1in change nothing; hits in Am refresh recency.

Eviction (the paper's ``reclaimfor``, as libCacheSim 0.3.5 ``TwoQ`` does it): take Am's LRU
block when Am is not empty and A1in is within its share ``int(capacity * a_in_ratio)``,
otherwise take A1in's oldest block (and remember it in A1out, bounded by
``int(capacity * a_out_ratio)`` keys). Driven one block at a time without pins this makes
exactly libCacheSim's decisions for every capacity >= 4.

Documented difference: libCacheSim refuses to store anything when ``int(capacity * 0.25)`` is
0 (capacity < 4 with the default ratio: its A1in cannot hold one object), so every access
misses. Here such a cache still works (A1in simply gives up its block on every eviction).

Protocol notes: a ghost hit is recognised in ``touch`` (the key leaves A1out before the
eviction that makes room for it, as in the paper and in libCacheSim) and the key is stored
into Am by the ``insert`` that follows. A block enters its queue at the young end when its
store completes (pending blocks are not in the queues; they still count toward A1in's
share). A pin is not an access: a load's pin and unpin leave the block where it is (pinned
blocks are skipped by eviction), so blocks mode through the manager makes exactly the
decisions of the policy driven alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping

from kvoffload._checks import check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import next_unprotected


class TwoQCachePolicy(CachePolicy):
    """2Q (VLDB'94): FIFO for first uses, a ghost FIFO of its evictees, LRU for re-used blocks."""

    name = "2q"

    def __init__(
        self, cache_capacity: int, *, a_in_ratio: float = 0.25, a_out_ratio: float = 0.5
    ) -> None:
        super().__init__(cache_capacity)
        self.a_in_ratio = check_number("a_in_ratio", a_in_ratio, 0, 1.0)
        self.a_out_ratio = check_number("a_out_ratio", a_out_ratio, 0, 16.0)
        self._in_limit = int(cache_capacity * self.a_in_ratio)
        self._out_limit = int(cache_capacity * self.a_out_ratio)
        self._in_members: set[OffloadKey] = set()  # every resident A1in block, pinned or not
        self._in_order: OrderedDict[OffloadKey, None] = OrderedDict()  # ready, oldest first
        self._am_order: OrderedDict[OffloadKey, None] = OrderedDict()  # ready, LRU first
        self._pinned: set[OffloadKey] = set()  # ready blocks being read (kept in their order)
        self._out: OrderedDict[OffloadKey, None] = OrderedDict()  # ghosts, oldest first
        # Keys whose ghost was hit by ``touch`` and that go to Am when inserted.
        self._reused: OrderedDict[OffloadKey, None] = OrderedDict()

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        reused = self._reused.pop(key, 0) is None
        if self._out.pop(key, 0) is None:  # inserted without a touch: still a ghost hit
            reused = True
        if reused:
            order = self._am_order
        else:
            self._in_members.add(key)
            order = self._in_order
        if block.ref_cnt == 0:
            order[key] = None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._pinned.discard(key)
        self._in_members.discard(key)
        self._in_order.pop(key, None)
        self._am_order.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        blocks, am_order, out = self._blocks, self._am_order, self._out
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            if key in blocks:
                if key in am_order:
                    am_order.move_to_end(key)
            elif key in out:
                del out[key]
                self._reused[key] = None
                if len(self._reused) > max(1, self.cache_capacity):
                    self._reused.popitem(last=False)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        pinned = self._pinned
        if n > len(self._in_order) + len(self._am_order) - len(pinned):
            return None
        if pinned:
            protected = pinned.union(protected)
        in_iter, am_iter = iter(self._in_order), iter(self._am_order)
        in_size = len(self._in_members)
        am_size = len(self._blocks) - in_size
        from_in: list[OffloadKey] = []
        from_am: list[OffloadKey] = []
        for _ in range(n):
            if am_size > 0 and in_size <= self._in_limit:
                key = next_unprotected(am_iter, protected)
                if key is not None:
                    from_am.append(key)
                    am_size -= 1
                    continue
            key = next_unprotected(in_iter, protected)
            if key is not None:
                from_in.append(key)
                in_size -= 1
                continue
            key = next_unprotected(am_iter, protected)
            if key is None:
                return None
            from_am.append(key)
            am_size -= 1
        for key in from_am:
            del self._am_order[key]
        for key in from_in:
            del self._in_order[key]
            self._in_members.discard(key)
            self._remember(key)
        return from_am + from_in

    def _remember(self, key: OffloadKey) -> None:
        if self._out_limit <= 0:
            return
        self._out[key] = None
        while len(self._out) > self._out_limit:
            self._out.popitem(last=False)

    def on_clear(self) -> None:
        for container in (
            self._in_members,
            self._in_order,
            self._am_order,
            self._out,
            self._reused,
            self._pinned,
        ):
            container.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        if key not in self._blocks:
            return
        if key in self._pinned:  # a load ended: not an access, the block stays where it is
            self._pinned.discard(key)
            return
        order = self._in_order if key in self._in_members else self._am_order
        if key not in order:  # its store completed: it joins the young end
            order[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if key in self._in_order or key in self._am_order:
            self._pinned.add(key)

    def stats(self) -> Mapping[str, float]:
        return {
            "a1in_size": len(self._in_members),
            "am_size": len(self._blocks) - len(self._in_members),
            "a1out_size": len(self._out),
            "evictable": len(self._in_order) + len(self._am_order) - len(self._pinned),
        }
