"""LFU: evict the ready block used the fewest times; among equals, the least recently used.

A block's count starts at 1 when it is stored and rises by one per use; it is forgotten when
the block leaves (no history, no aging: see ``lfuda`` for aging).

Tie-break (as in libCacheSim 0.3.5 ``LFU``): blocks with equal counts are evicted in the order
in which they reached that count. Since every use raises the count, that is the order of
their last use, i.e. least recently used first. Here a block that becomes evictable again
(its store or a load completed) also goes behind the blocks of its count, since finishing a
load is a use. Driven one block at a time without pins it makes exactly libCacheSim's ``LFU``
decisions.

Structure (the O(1) LFU of Shah, Mitra & Matani, 2010): a list of count nodes in increasing
order, each with its evictable blocks in order of arrival; a use moves a block to the next
node. Pinned and pending blocks belong to their node (so a node outlives its evictable
blocks) but are not in its order; eviction walks nodes from the lowest count and skips nodes
that hold only pinned or pending blocks, at most one per distinct count among them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy


class _CountNode:
    """All stored blocks used ``count`` times; ``evictable`` in order of arrival."""

    __slots__ = ("count", "evictable", "higher", "lower", "members")

    def __init__(self, count: int) -> None:
        self.count = count
        self.members = 0  # stored blocks with this count, pinned and pending included
        self.evictable: OrderedDict[OffloadKey, None] = OrderedDict()
        self.lower: _CountNode | None = None
        self.higher: _CountNode | None = None


class LFUCachePolicy(CachePolicy):
    """Least frequently used: evicts the ready block with the fewest uses (LRU among equals)."""

    name = "lfu"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._node_of: dict[OffloadKey, _CountNode] = {}
        self._lowest: _CountNode | None = None
        self._evictable_count = 0

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        node = self._lowest
        if node is None or node.count != 1:
            node = self._link_after(None, 1)
        self._node_of[key] = node
        node.members += 1
        if block.ref_cnt == 0:
            node.evictable[key] = None
            self._evictable_count += 1

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._leave(key, self._node_of.pop(key))

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Count one use of each ready block; walk tail to head so the head is most recent."""
        blocks, node_of = self._blocks, self._node_of
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            status = blocks.get(key)
            if status is None or status.ref_cnt < 0:
                continue
            node = node_of[key]
            higher = node.higher
            if higher is None or higher.count != node.count + 1:
                higher = self._link_after(node, node.count + 1)
            higher.members += 1
            if node.evictable.pop(key, 0) is None:
                higher.evictable[key] = None
            node_of[key] = higher
            node.members -= 1
            if node.members == 0:
                self._unlink(node)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        node_of = self._node_of
        blocked = sum(
            1 for key in set(protected) if key in node_of and key in node_of[key].evictable
        )
        if n > self._evictable_count - blocked:
            return None
        chosen: list[OffloadKey] = []
        node = self._lowest
        while node is not None and len(chosen) < n:
            for key in node.evictable:
                if key not in protected:
                    chosen.append(key)
                    if len(chosen) == n:
                        break
            node = node.higher
        for key in chosen:
            self._leave(key, node_of.pop(key))
        return chosen

    def on_clear(self) -> None:
        self._node_of.clear()
        self._lowest = None
        self._evictable_count = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        node = self._node_of.get(key)
        if node is not None and key not in node.evictable:
            node.evictable[key] = None
            self._evictable_count += 1

    def mark_non_evictable(self, key: OffloadKey) -> None:
        node = self._node_of.get(key)
        if node is not None and node.evictable.pop(key, 0) is None:
            self._evictable_count -= 1

    def stats(self) -> Mapping[str, float]:
        return {"blocks": len(self._blocks), "evictable": self._evictable_count}

    # ------------------------------------------------------------------ count nodes
    def _leave(self, key: OffloadKey, node: _CountNode) -> None:
        """``key`` (already out of the tables) leaves ``node``; drop the node when empty."""
        if node.evictable.pop(key, 0) is None:
            self._evictable_count -= 1
        node.members -= 1
        if node.members == 0:
            self._unlink(node)

    def _link_after(self, node: _CountNode | None, count: int) -> _CountNode:
        """A new node for ``count`` right above ``node`` (``None``: as the lowest)."""
        new = _CountNode(count)
        higher = self._lowest if node is None else node.higher
        new.lower, new.higher = node, higher
        if node is None:
            self._lowest = new
        else:
            node.higher = new
        if higher is not None:
            higher.lower = new
        return new

    def _unlink(self, node: _CountNode) -> None:
        lower, higher = node.lower, node.higher
        if lower is None:
            self._lowest = higher
        else:
            lower.higher = higher
        if higher is not None:
            higher.lower = lower
        node.lower = node.higher = None
