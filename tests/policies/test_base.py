"""The base class: its table, its one batching rule, its double-insert error.

Some built-ins batch ``insert_many`` and ``mark_evictable_many`` past their own ``insert`` /
``mark_evictable``; by the base's ``__init_subclass__`` rule a subclass that overrides those
still sees every key, in order, or its hook (and the ``one_at_a_time`` references of the
other policy tests) would be silently skipped.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import int_key


def _recording(policy_cls: type[CachePolicy]) -> Any:
    class Recording(policy_cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.inserted: list[OffloadKey] = []
            self.marked: list[OffloadKey] = []

        def insert(
            self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
        ) -> None:
            self.inserted.append(key)
            super().insert(key, block, req_context)

        def mark_evictable(self, key: OffloadKey) -> None:
            self.marked.append(key)
            super().mark_evictable(key)

    return Recording


@pytest.mark.parametrize("name, module, class_name", [row[:3] for row in BUILTIN_POLICIES])
def test_batched_calls_go_through_hooked_single_calls(
    name: str, module: str, class_name: str
) -> None:
    policy = _recording(getattr(importlib.import_module(module), class_name))(16)
    keys = [int_key(i) for i in range(5)]
    statuses = [BlockStatus(i, -1) for i in range(5)]
    ctx = ReqContext(req_id="r")
    policy.insert_many(keys, statuses, ctx)
    assert policy.inserted == keys, name
    for status in statuses:
        status.ref_cnt = 0
    policy.mark_evictable_many(list(reversed(keys)))
    assert policy.marked == list(reversed(keys)), name
    victims = policy.evict(5, set())
    assert victims is not None and sorted(k for k, _ in victims) == sorted(keys), name


class _Minimal(CachePolicy):
    """The smallest policy on the base's table: evicts ready blocks in insertion order."""

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        self._blocks[key] = block

    def remove(self, key: OffloadKey) -> None:
        self._blocks.pop(key, None)

    def touch(self, keys: Any, req_context: ReqContext | None = None) -> None:
        pass

    def evict(self, n: int, protected: Any) -> Any:
        ready = [k for k, s in self._blocks.items() if s.ref_cnt == 0 and k not in protected]
        if len(ready) < n:
            return None
        return [(k, self._blocks.pop(k)) for k in ready[:n]]

    def clear(self) -> None:
        self._blocks.clear()


def test_the_base_owns_the_table() -> None:
    policy = _Minimal(4)
    key, status = int_key(1), BlockStatus(0, 0)
    policy.insert(key, status)
    assert policy.get(key) is status and key in policy and len(policy) == 1
    assert policy.block_table == {key: status}
    # Every built-in exposes it, so the manager always takes its direct-lookup path.
    for row in BUILTIN_POLICIES:
        cls = getattr(importlib.import_module(row[1]), row[2])
        assert cls(4).block_table is not None, row[0]


def test_overriding_a_single_call_brings_back_the_base_loop() -> None:
    from kvoffload.policies.lru import LRUCachePolicy

    class HooksInsert(LRUCachePolicy):
        def insert(
            self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
        ) -> None:
            super().insert(key, block, req_context)

    class HooksBoth(HooksInsert):
        def insert_many(self, keys: Any, blocks: Any, req_context: Any = None) -> None:
            super().insert_many(keys, blocks, req_context)

    assert HooksInsert.insert_many is CachePolicy.insert_many
    assert HooksBoth.insert_many is not CachePolicy.insert_many  # its own batch is kept
    assert HooksInsert.mark_evictable_many is LRUCachePolicy.mark_evictable_many


def test_overriding_touch_means_it_may_learn_from_misses() -> None:
    from kvoffload.policies.lru import LRUCachePolicy

    assert LRUCachePolicy.touches_misses is False

    class Touches(LRUCachePolicy):
        def touch(self, keys: Any, req_context: ReqContext | None = None) -> None:
            super().touch(keys, req_context)

    class DeclaresItself(LRUCachePolicy):
        touches_misses = False

        def touch(self, keys: Any, req_context: ReqContext | None = None) -> None:
            super().touch(keys, req_context)

    class Inherits(Touches):
        pass

    assert Touches.touches_misses is True and Inherits.touches_misses is True
    assert DeclaresItself.touches_misses is False


def test_a_class_with_its_own_get_has_no_table_view() -> None:
    class OwnGet(_Minimal):
        def get(self, key: OffloadKey) -> BlockStatus | None:
            return self._blocks.get(key)

    assert OwnGet(2).block_table is None  # the manager must call this get
    assert _Minimal(2).block_table is not None


@pytest.mark.parametrize("name, module, class_name", [row[:3] for row in BUILTIN_POLICIES])
def test_inserting_a_stored_key_raises_and_keeps_the_sizes(
    name: str, module: str, class_name: str
) -> None:
    cls = getattr(importlib.import_module(module), class_name)
    policy, twin = cls(8), cls(8)  # the twin never sees the refused inserts
    key = int_key(7)
    statuses = []
    for p in (policy, twin):
        p.touch([key])
        statuses.append(BlockStatus(0, -1))
        p.insert(key, statuses[-1])
    with pytest.raises(ValueError, match="already stored"):
        policy.insert(key, BlockStatus(1, -1))
    with pytest.raises(ValueError, match="already stored"):
        policy.insert_many([int_key(8), key], [BlockStatus(2, -1), BlockStatus(3, -1)])
    assert policy.get(key) is statuses[0] and policy.get(int_key(8)) is None
    for p, status in zip((policy, twin), statuses, strict=True):
        status.ref_cnt = 0
        p.mark_evictable(key)
        assert p.evict(1, set()) == [(key, status)]
    # Segment / window / queue sizes as if the refused calls never happened (slru's segment
    # and wtinylfu's window said 1 with no block left).
    assert policy.stats() == twin.stats()
    assert len(policy) == 0


@pytest.mark.parametrize("name", ["lru", "lfuda", "mq", "s3fifo", "wtinylfu"])
def test_a_batched_insert_of_unequal_lengths_raises_and_changes_nothing(name: str) -> None:
    """The batched inserts built on ``_add_blocks`` check the lengths before any update (a
    ``zip(strict=True)`` alone would raise half-way, with some keys stored)."""
    cls = CachePolicyFactory.get_cache_policy_cls(name)
    policy = cls(8)
    with pytest.raises(ValueError, match="2 keys but 1 blocks"):
        policy.insert_many([int_key(1), int_key(2)], [BlockStatus(0, -1)])
    assert len(policy) == 0 and policy.get(int_key(1)) is None
