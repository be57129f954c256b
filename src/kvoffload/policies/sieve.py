"""SIEVE (Zhang et al., NSDI'24): a FIFO queue, one visited bit per block, and a moving hand.

New blocks enter at the new end of the queue and a use only sets the block's visited bit.
The hand starts at the old end and moves toward the new end: a visited block has its bit
cleared and is passed over, the first unvisited block is evicted, and the hand stays where the
victim was (it wraps to the old end after the new end). Unlike CLOCK, survivors never move,
so new blocks are sifted out quickly while blocks that proved useful stay in the old part.
Driven one block at a time without pins it makes exactly libCacheSim's ``Sieve`` decisions.

Pinned, pending and protected blocks are passed over by the hand with their bit unchanged.
The cost: each sweep steps over those blocks, so eviction is O(victims + bits cleared +
blocks in flight) rather than O(victims).

The queue is an intrusive doubly linked list (the hand must resume from any block, which an
``OrderedDict`` cannot do). ``evict`` is atomic without undo: it checks that enough blocks are
eligible, walks the hand without writing anything, and only then clears the bits it passed,
unlinks the victims and moves the hand.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.evictable_set import EvictableSetPolicy


class _Node:
    """One block in the queue; ``newer`` points toward the new end, ``older`` toward the old."""

    __slots__ = ("key", "newer", "older", "status", "visited")

    def __init__(self, key: OffloadKey, status: BlockStatus) -> None:
        self.key = key
        self.status = status
        self.visited = False
        self.newer: _Node | None = None
        self.older: _Node | None = None


class SieveCachePolicy(EvictableSetPolicy):
    """SIEVE (NSDI'24): a FIFO with visited bits; a hand evicts the first unvisited block."""

    name = "sieve"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._nodes: dict[OffloadKey, _Node] = {}
        self._oldest: _Node | None = None
        self._newest: _Node | None = None
        self._hand: _Node | None = None  # None: the next sweep starts at the old end

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        super().on_insert(key, block, req_context)
        node = _Node(key, block)
        node.older = self._newest
        if self._newest is None:
            self._oldest = node
        else:
            self._newest.newer = node
        self._newest = node
        self._nodes[key] = node

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        super().on_remove(key, block)
        self._unlink(self._nodes.pop(key))

    def _unlink(self, node: _Node) -> None:
        if self._hand is node:
            self._hand = node.newer
        if node.older is None:
            self._oldest = node.newer
        else:
            node.older.newer = node.newer
        if node.newer is None:
            self._newest = node.older
        else:
            node.newer.older = node.older
        node.older = node.newer = None

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Set the visited bit of each ready block (a block still being written is not used)."""
        nodes = self._nodes
        for key in keys:
            node = nodes.get(key)
            if node is not None and node.status.ref_cnt >= 0:
                node.visited = True

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if not self._can_evict(n, protected):
            return None
        evictable = self._evictable
        chosen: list[_Node] = []
        chosen_set: set[_Node] = set()
        cleared: set[_Node] = set()  # visited bits the hand clears on its first pass
        node = self._hand if self._hand is not None else self._oldest
        # Each eligible block is taken at the latest on the hand's second pass over it.
        while node is not None:
            if node not in chosen_set and node.key in evictable and node.key not in protected:
                if node.visited and node not in cleared:
                    cleared.add(node)
                else:
                    chosen.append(node)
                    chosen_set.add(node)
                    if len(chosen) == n:
                        break
            node = node.newer if node.newer is not None else self._oldest
        hand = node.newer if node is not None else None
        while hand is not None and hand in chosen_set:  # the hand rests on a survivor
            hand = hand.newer
        for passed in cleared:
            passed.visited = False
        keys = [victim.key for victim in chosen]
        nodes = self._nodes
        for victim, key in zip(chosen, keys, strict=True):
            del nodes[key]
            evictable.remove(key)
            self._unlink(victim)
        self._hand = hand
        return keys

    def on_clear(self) -> None:
        super().on_clear()
        self._nodes.clear()
        self._oldest = self._newest = self._hand = None
