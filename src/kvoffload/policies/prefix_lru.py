"""Prefix-aware LRU: LRU over the leaves of the cached prefix tree, so tails go before heads.

A KV block is only usable when every block before it in its prefix chain is cached too, so a
cached tail whose head was evicted wastes its slot. Plain LRU keeps chains whole only as long
as every driver touches tails before heads; this policy makes it a rule:

* **Parent links.** A block's parent is the block its request touched just before it (keys
  of one request arrive in prefix order, head first), linked when the block is inserted and
  the parent is cached. When the request's token positions are known (``ReqContext``) a
  "parent" that does not end before the block is ignored. Without a ``ReqContext`` the keys
  of one ``touch`` call are taken as one chain.
* **Order.** Evictable blocks sit in one LRU order; a request's touch walks its keys tail to
  head, so when a request's blocks share a recency the deeper ones go first.
* **Leaves first.** Eviction walks the order from its LRU end and skips (defers) blocks that
  still have a cached child; a deferred block waits apart, off the walk, until its last
  child leaves, then re-enters at the LRU end, since it is older than everything after it.
  So a block never goes before a cached descendant, unless the descendants are pinned,
  pending or protected and no leaf is left: then the deferred blocks with no evictable
  descendant go first (the deepest ones), and ``stats()["forced_parent_evictions"]`` counts it.

Costs: O(1) amortised per operation (each deferral moves a block out of the walk once); only
a forced eviction scans the deferred blocks. Re-entering at the LRU end is exact except
among several blocks released by the same eviction, which re-enter youngest first.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims

_INSTANCE_IDS = itertools.count()


class _Node:
    """One cached block: its status, its parent (a node, maybe dead) and live child count."""

    __slots__ = ("alive", "children", "key", "parent", "status")

    def __init__(self, key: OffloadKey, status: BlockStatus, parent: _Node | None) -> None:
        self.key = key
        self.status = status
        self.parent = parent
        self.children = 0
        self.alive = True


class _Chain:
    """What one request touched, in order: each key's predecessor (``None`` for the first)."""

    __slots__ = ("last", "pred")

    def __init__(self) -> None:
        self.pred: dict[OffloadKey, OffloadKey | None] = {}
        self.last: OffloadKey | None = None


class _Chains(dict[int, _Chain]):
    """Per-request chains kept in the ``ReqContext``, one per policy instance (tiers share it)."""


class PrefixLRUCachePolicy(CachePolicy):
    """Prefix-aware LRU: evicts leaves first, so a cached tail never outlives its head."""

    name = "prefix-lru"

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._id = next(_INSTANCE_IDS)
        self._nodes: dict[OffloadKey, _Node] = {}
        self._blocks: dict[OffloadKey, BlockStatus] = {}  # the same keys, for block_table
        # Evictable blocks, least recent first (some may still have children: found on a walk).
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()
        # Evictable blocks found to have cached children, in the order they were deferred.
        self._waiting: dict[OffloadKey, None] = {}
        self._anonymous = _Chain()  # the last touch call made without a ReqContext
        self._forced = 0

    # ------------------------------------------------------------------ chains
    def _chain(self, req_context: ReqContext | None) -> _Chain:
        if req_context is None:
            return self._anonymous
        chains = req_context.get_state(_Chains)
        if chains is None:
            chains = _Chains()
            req_context.set_state(chains)
        chain = chains.get(self._id)
        if chain is None:
            chain = chains[self._id] = _Chain()
        return chain

    @staticmethod
    def _follows(req_context: ReqContext | None, parent: OffloadKey, key: OffloadKey) -> bool:
        """False only when known token positions say ``parent`` does not end before ``key``."""
        if req_context is None:
            return True
        parent_end = req_context.get_offload_key_position(parent)
        key_end = req_context.get_offload_key_position(key)
        return parent_end is None or key_end is None or parent_end < key_end

    def _record_chain(self, keys: list[OffloadKey], req_context: ReqContext | None) -> None:
        if req_context is None:
            self._anonymous = _Chain()
        chain = self._chain(req_context)
        pred, last = chain.pred, chain.last
        for key in keys:
            if key != last:
                pred[key] = last
                last = key
        chain.last = last

    def _parent_of(self, key: OffloadKey, req_context: ReqContext | None) -> _Node | None:
        chain = self._chain(req_context)
        if key in chain.pred:
            parent_key = chain.pred.pop(key)
        else:  # inserted without a touch first: it follows whatever the request saw last
            parent_key = chain.last if chain.last != key else None
            chain.last = key
        if parent_key is None or not self._follows(req_context, parent_key, key):
            return None
        return self._nodes.get(parent_key)

    # ------------------------------------------------------------------ the contract
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    @property
    def block_table(self) -> Mapping[OffloadKey, BlockStatus]:
        return self._blocks

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        if key in self._nodes:
            self.remove(key)
        parent = self._parent_of(key, req_context)
        self._nodes[key] = _Node(key, block, parent)
        self._blocks[key] = block
        if parent is not None:
            parent.children += 1
        if block.ref_cnt == 0:
            self._order[key] = None

    def insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        if type(self).insert is not PrefixLRUCachePolicy.insert:  # a subclass hooks insert
            super().insert_many(keys, blocks, req_context)
            return
        # insert for each key, with the chain and the key positions looked up once per key.
        nodes, statuses, order = self._nodes, self._blocks, self._order
        chain = self._chain(req_context)
        pred = chain.pred
        position = None if req_context is None else req_context.get_offload_key_position
        last_key: OffloadKey | None = None  # the previous key and its position
        last_end: int | None = None
        for key, block in zip(keys, blocks, strict=True):
            if key in nodes:
                self.remove(key)
            if key in pred:
                parent_key = pred.pop(key)
            else:  # inserted without a touch first: it follows whatever the request saw last
                parent_key = chain.last if chain.last != key else None
                chain.last = key
            parent = None
            if position is None:
                if parent_key is not None:
                    parent = nodes.get(parent_key)
            else:
                key_end = position(key)
                if parent_key is not None:
                    parent_end = last_end if parent_key is last_key else position(parent_key)
                    if parent_end is None or key_end is None or parent_end < key_end:
                        parent = nodes.get(parent_key)
                last_key, last_end = key, key_end
            nodes[key] = _Node(key, block, parent)
            statuses[key] = block
            if parent is not None:
                parent.children += 1
            if block.ref_cnt == 0:
                order[key] = None

    def remove(self, key: OffloadKey) -> None:
        node = self._nodes.pop(key, None)
        if node is None:
            return
        del self._blocks[key]
        self._unlist(key)
        self._detach(node)

    def _detach(self, node: _Node) -> None:
        """``node`` left the cache: its parent loses a child and may become a leaf."""
        node.alive = False
        parent, node.parent = node.parent, None
        if parent is None or not parent.alive:
            return
        parent.children -= 1
        if parent.children == 0 and parent.key in self._waiting:
            del self._waiting[parent.key]
            self._order[parent.key] = None
            self._order.move_to_end(parent.key, last=False)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        self._record_chain(keys, req_context)
        order, waiting = self._order, self._waiting
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)
            elif key in waiting:
                del waiting[key]
                order[key] = None

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        if n > len(self._order) + len(self._waiting):
            return None
        plan = _EvictionPlan(self._nodes, self._waiting, protected)
        plan.take_leaves(self._order, n)
        if len(plan.chosen) < n:
            plan.take_forced(n)
        if len(plan.chosen) < n:
            return None
        return self._commit(plan)

    def _commit(self, plan: _EvictionPlan) -> Victims:
        order, waiting, nodes = self._order, self._waiting, self._nodes
        if plan.deferred:
            chosen = set(plan.chosen)
            for key in plan.deferred:
                if key not in chosen:
                    del order[key]
                    waiting[key] = None
        pop_status = self._blocks.pop
        victims: Victims = []
        append = victims.append
        for key in plan.chosen:
            node = nodes.pop(key)
            if key in order:  # _unlist
                del order[key]
            else:
                waiting.pop(key, None)
            if node.children > 0:
                self._forced += 1
            # _detach: the parent loses a child and may become a leaf.
            node.alive = False
            parent, node.parent = node.parent, None
            if parent is not None and parent.alive:
                parent.children -= 1
                if parent.children == 0 and parent.key in waiting:
                    del waiting[parent.key]
                    order[parent.key] = None
                    order.move_to_end(parent.key, last=False)
            append((key, pop_status(key)))
        return victims

    def clear(self) -> None:
        self._nodes.clear()
        self._blocks.clear()
        self._order.clear()
        self._waiting.clear()
        self._anonymous = _Chain()
        self._forced = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._nodes:
            self._waiting.pop(key, None)
            self._order[key] = None
            self._order.move_to_end(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        if type(self).mark_evictable is not PrefixLRUCachePolicy.mark_evictable:  # a subclass hook
            super().mark_evictable_many(keys)
            return
        nodes, order, waiting = self._nodes, self._order, self._waiting
        for key in keys:
            if key in nodes:
                if key in order:
                    order.move_to_end(key)
                else:
                    if key in waiting:
                        del waiting[key]
                    order[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._unlist(key)

    def _unlist(self, key: OffloadKey) -> None:
        """Take ``key`` out of the evictable blocks (the walk or the waiting parents)."""
        if key in self._order:
            del self._order[key]
        else:
            self._waiting.pop(key, None)

    def on_request_finished(self, req_context: ReqContext) -> None:
        chains = req_context.get_state(_Chains)
        if chains is not None:
            chains.pop(self._id, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._nodes),
            "evictable": len(self._order) + len(self._waiting),
            "waiting_parents": len(self._waiting),
            "forced_parent_evictions": self._forced,
        }


class _EvictionPlan:
    """Chooses victims without touching the policy's state, so a failed evict changes nothing."""

    def __init__(
        self,
        nodes: dict[OffloadKey, _Node],
        waiting: dict[OffloadKey, None],
        protected: Collection[OffloadKey],
    ) -> None:
        self.nodes = nodes
        self.waiting = waiting
        self.protected = protected
        self.chosen: list[OffloadKey] = []
        self.deferred: list[OffloadKey] = []  # walked blocks with children, in walk order
        self._deferred_set: set[OffloadKey] = set()
        self._gone: dict[OffloadKey, int] = {}  # children chosen so far, per parent key

    def _children_left(self, node: _Node) -> int:
        return node.children - self._gone.get(node.key, 0)

    def _choose(self, node: _Node) -> _Node | None:
        """Take ``node``; return its parent if that just became a deferred, free leaf."""
        self.chosen.append(node.key)
        parent = node.parent
        if parent is None or not parent.alive:
            return None
        self._gone[parent.key] = self._gone.get(parent.key, 0) + 1
        if self._children_left(parent) > 0 or parent.key in self.protected:
            return None
        behind = parent.key in self.waiting or parent.key in self._deferred_set
        return parent if behind else None

    def take_leaves(self, order: Iterable[OffloadKey], n: int) -> None:
        """Walk the LRU order; a parent freed behind the walk is the next victim."""
        nodes, protected, waiting = self.nodes, self.protected, self.waiting
        chosen, deferred, deferred_set, gone = (
            self.chosen, self.deferred, self._deferred_set, self._gone
        )
        walk = iter(order)
        released: _Node | None = None
        while len(chosen) < n:
            if released is not None:
                node = released
            else:
                key = next(walk, None)
                if key is None:
                    return
                node = nodes[key]
                if node.children and node.children - gone.get(key, 0) > 0:
                    deferred.append(key)
                    deferred_set.add(key)
                    continue
                if key in protected:
                    continue
            # _choose(node), inlined: take it; its parent is next if that just became a
            # deferred, free leaf.
            chosen.append(node.key)
            released = None
            parent = node.parent
            if parent is None or not parent.alive:
                continue
            parent_key = parent.key
            taken = gone[parent_key] = gone.get(parent_key, 0) + 1
            if parent.children - taken > 0 or parent_key in protected:
                continue
            if parent_key in waiting or parent_key in deferred_set:
                released = parent

    def take_forced(self, n: int) -> None:
        """No free leaf is left: take deferred blocks, those with no evictable descendant first."""
        taken = set(self.chosen)
        candidates = [
            key
            for key in itertools.chain(self.waiting, self.deferred)
            if key not in self.protected and key not in taken
        ]
        candidate_set = set(candidates)
        below: dict[OffloadKey, int] = {}  # candidate children per candidate
        for key in candidates:
            parent = self.nodes[key].parent
            if parent is not None and parent.alive and parent.key in candidate_set:
                below[parent.key] = below.get(parent.key, 0) + 1
        stack = [key for key in reversed(candidates) if key not in below]
        while stack and len(self.chosen) < n:
            node = self.nodes[stack.pop()]
            self._choose(node)
            parent = node.parent
            if parent is not None and parent.alive and parent.key in below:
                below[parent.key] -= 1
                if below[parent.key] == 0:
                    del below[parent.key]
                    stack.append(parent.key)


__all__ = ["PrefixLRUCachePolicy"]
