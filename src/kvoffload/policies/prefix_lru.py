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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy

_INSTANCE_IDS = itertools.count()
_UNSEEN: Any = object()  # a key the request did not touch


# One cached block: ``[children, parent, key, alive]``, a list rather than an object because
# one is built for every stored block. ``children`` counts the live nodes linked to it;
# ``parent`` is a node (maybe dead since: a re-stored key gets a new node) or ``None``.
_Node = list[Any]
_CHILDREN, _PARENT, _KEY, _ALIVE = 0, 1, 2, 3  # (the hot loops index with the literals)


def _new_node(key: OffloadKey, parent: _Node | None) -> _Node:
    return [0, parent, key, True]


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
    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        parent = self._parent_of(key, req_context)
        self._nodes[key] = _new_node(key, parent)
        if parent is not None:
            parent[_CHILDREN] += 1
        if block.ref_cnt == 0:
            self._order[key] = None

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        # on_insert for each key, with the chain and the key positions looked up once per key.
        nodes, order = self._nodes, self._order
        chain = self._chain(req_context)
        # Every key's touched predecessor, taken off the chain now (as each insert would).
        parent_keys = list(map(chain.pred.pop, keys, itertools.repeat(_UNSEEN)))
        position = None if req_context is None else _position_getter(req_context)
        last_key: OffloadKey | None = None  # the previous key and its position
        last_end: int | None = None
        for key, block, parent_key in zip(keys, blocks, parent_keys, strict=True):
            if parent_key is _UNSEEN:  # inserted without a touch first: it follows whatever
                parent_key = chain.last if chain.last != key else None  # the request saw last
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
            nodes[key] = [0, parent, key, True]  # _new_node(key, parent)
            if parent is not None:
                parent[0] += 1
            if block.ref_cnt == 0:
                order[key] = None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        node = self._nodes.pop(key)
        self._unlist(key)
        self._detach(node)

    def _detach(self, node: _Node) -> None:
        """``node`` left the cache: its parent loses a child and may become a leaf."""
        node[_ALIVE] = False
        parent, node[_PARENT] = node[_PARENT], None
        if parent is None or not parent[_ALIVE]:
            return
        parent[_CHILDREN] -= 1
        parent_key = parent[_KEY]
        if parent[_CHILDREN] == 0 and parent_key in self._waiting:
            del self._waiting[parent_key]
            self._order[parent_key] = None
            self._order.move_to_end(parent_key, last=False)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = keys if isinstance(keys, list) else list(keys)
        self._record_chain(keys, req_context)
        if self._blocks.keys().isdisjoint(keys):  # a store's misses: nothing to reorder
            return
        order, waiting = self._order, self._waiting
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)
            elif key in waiting:
                del waiting[key]
                order[key] = None

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        order, waiting, nodes = self._order, self._waiting, self._nodes
        if n > len(order) + len(waiting):
            return None
        # Walk the LRU order; a block with children left is deferred; a parent freed behind the
        # walk (waiting or deferred) is the next victim. Each victim's parent loses its child
        # right away (undone if the call fails), so a count of 0 means "no child left".
        chosen: list[OffloadKey] = []
        deferred: list[OffloadKey] = []  # walked blocks with children, in walk order
        deferred_set: set[OffloadKey] = set()
        freed: list[OffloadKey] = []  # parents freed behind the walk but not taken, in order
        left = n
        for key in order:
            node = nodes[key]
            if node[0]:  # children left
                deferred.append(key)
                deferred_set.add(key)
                continue
            if key in protected:
                continue
            while True:  # take it; its parent is next if that just became a free leaf behind
                chosen.append(key)
                left -= 1
                parent = node[1]
                if parent is None or not parent[3]:
                    break
                parent[0] -= 1
                if parent[0]:
                    break
                key = parent[2]
                if key not in waiting and key not in deferred_set:
                    break  # still ahead in the walk (or walked and protected): no move
                if not left or key in protected:
                    freed.append(key)  # re-enters the walk's front at commit
                    break
                node = parent
            if not left:
                break
        walked = len(chosen)
        if left:
            _take_forced(nodes, waiting, protected, chosen, deferred, n)
            if len(chosen) < n:  # fail: give the walked victims' parents their children back
                for key in chosen[:walked]:
                    parent = nodes[key][1]
                    if parent is not None and parent[3]:
                        parent[0] += 1
                return None
        # Commit.
        if deferred:
            taken = set(chosen)
            for key in deferred:
                if key not in taken:
                    del order[key]
                    waiting[key] = None
        for key in chosen[:walked] if left else chosen:
            del nodes[key]  # a leaf: no live node refers to it
            if key in order:
                del order[key]
            else:
                waiting.pop(key, None)
        for key in freed:  # its last child left: it re-enters at the LRU end
            if key in waiting:
                del waiting[key]
                order[key] = None
                order.move_to_end(key, last=False)
        if left:
            for key in chosen[walked:]:  # forced: children of theirs stay cached
                node = nodes.pop(key)
                self._unlist(key)
                if node[_CHILDREN] > 0:
                    self._forced += 1
                self._detach(node)
        return chosen

    def on_clear(self) -> None:
        self._nodes.clear()
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


def _position_getter(req_context: ReqContext) -> Callable[[OffloadKey], int | None]:
    """``req_context.get_offload_key_position``, as a C-level lookup when it is the stock one."""
    if type(req_context).get_offload_key_position is ReqContext.get_offload_key_position:
        return req_context.key_positions.get
    return req_context.get_offload_key_position


def _take_forced(
    nodes: dict[OffloadKey, _Node],
    waiting: dict[OffloadKey, None],
    protected: Collection[OffloadKey],
    chosen: list[OffloadKey],
    deferred: list[OffloadKey],
    n: int,
) -> None:
    """No free leaf is left: take deferred blocks, those with no evictable descendant first."""
    taken = set(chosen)
    candidates = [
        key
        for key in itertools.chain(waiting, deferred)
        if key not in protected and key not in taken
    ]
    candidate_set = set(candidates)
    below: dict[OffloadKey, int] = {}  # candidate children per candidate
    for key in candidates:
        parent = nodes[key][_PARENT]
        if parent is not None and parent[_ALIVE] and parent[_KEY] in candidate_set:
            below[parent[_KEY]] = below.get(parent[_KEY], 0) + 1
    stack = [key for key in reversed(candidates) if key not in below]
    while stack and len(chosen) < n:
        node = nodes[stack.pop()]
        chosen.append(node[_KEY])
        parent = node[_PARENT]
        if parent is None or not parent[_ALIVE]:
            continue
        parent_key = parent[_KEY]
        if parent_key in below:
            below[parent_key] -= 1
            if below[parent_key] == 0:
                del below[parent_key]
                stack.append(parent_key)


__all__ = ["PrefixLRUCachePolicy"]
