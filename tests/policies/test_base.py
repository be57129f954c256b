"""The base class: its table, its one batching rule, its double-insert error.

Some built-ins batch ``insert_many`` and ``mark_evictable_many`` past their own ``insert`` /
``mark_evictable``; by the base's ``__init_subclass__`` rule a subclass that overrides those
still sees every key, in order, or its hook (and the ``one_at_a_time`` references of the
other policy tests) would be silently skipped.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.testing import check_policy_conformance, int_key


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

    assert HooksInsert.insert_many is CachePolicy._insert_each
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


class _MRU(CachePolicy):
    """The README's MRU written the simple way: only its order, every table write the base's."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self._ready: dict[OffloadKey, None] = {}  # evictable keys, oldest use first

    def on_insert(self, key: OffloadKey, block: BlockStatus, req_context: Any) -> None:
        if block.ref_cnt == 0:
            self._ready[key] = None

    def touch(self, keys: Any, req_context: ReqContext | None = None) -> None:
        for key in reversed(keys):
            if key in self._ready:
                self._ready[key] = self._ready.pop(key)

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self:
            self._ready.pop(key, None)
            self._ready[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._ready.pop(key, None)

    def evict_keys(self, n: int, protected: Any) -> list[OffloadKey] | None:
        chosen = [k for k in reversed(self._ready) if k not in protected][:n]
        if len(chosen) < n:
            return None
        for key in chosen:
            del self._ready[key]
        return chosen

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._ready.pop(key, None)

    def on_clear(self) -> None:
        self._ready.clear()


def test_a_policy_of_hooks_alone_conforms() -> None:
    """Insert, evict, remove, clear and the double-insert rule are the base's: a policy that
    only orders passes the whole conformance suite."""
    check_policy_conformance(_MRU, capacities=(1, 4, 16), seeds=(0, 1), steps=200)


def test_the_whole_calls_written_by_hand_still_work() -> None:
    """The contract before the hooks (``insert`` / ``evict`` / ``remove`` / ``clear``
    overridden, ``self._blocks`` written by the class): still a policy, batches through its
    ``insert``, and ``evict_keys`` is not asked of it."""
    policy = _Minimal(4)
    keys = [int_key(i) for i in range(3)]
    statuses = [BlockStatus(i, 0) for i in range(3)]
    policy.insert_many(keys, statuses)
    assert policy.block_table == dict(zip(keys, statuses, strict=True))
    with pytest.raises(ValueError, match="already stored"):
        policy.insert_many([int_key(9), keys[0]], [BlockStatus(9, 0), BlockStatus(10, 0)])
    assert policy.evict(2, set()) == [(keys[0], statuses[0]), (keys[1], statuses[1])]
    policy.remove(keys[2])
    assert len(policy) == 0

    class NoEviction(CachePolicy):
        def touch(self, keys: Any, req_context: ReqContext | None = None) -> None:
            pass

    with pytest.raises(TypeError, match="evict_keys"):
        NoEviction(4)  # type: ignore[abstract]

    from kvoffload.policies.lru import LRUCachePolicy

    class WrapsEvict(LRUCachePolicy):  # a whole evict over the inherited one
        def evict(self, n: int, protected: Any) -> Any:
            return super().evict(n, protected)

    wrapped = WrapsEvict(4)
    wrapped.insert(keys[0], statuses[0])
    assert wrapped.evict(1, set()) == [(keys[0], statuses[0])]


def test_overriding_on_insert_brings_back_the_hook_loop() -> None:
    from kvoffload.policies.lru import LRUCachePolicy

    seen: list[OffloadKey] = []

    class Hooked(LRUCachePolicy):
        def on_insert(self, key: OffloadKey, block: BlockStatus, req_context: Any) -> None:
            seen.append(key)
            super().on_insert(key, block, req_context)

    assert Hooked.on_insert_many is CachePolicy.on_insert_many
    policy = Hooked(4)
    keys = [int_key(i) for i in range(3)]
    policy.insert_many(keys, [BlockStatus(i, 0) for i in range(3)])
    assert seen == keys
    assert [key for key, _ in policy.evict(3, set()) or []] == keys


def _table_writes(path: Path) -> list[str]:
    """Lines of ``path`` that write ``self._blocks`` (assign, delete, or a mutating call)."""
    mutators = {"pop", "popitem", "update", "clear", "setdefault", "__setitem__", "__delitem__"}

    def is_table(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "_blocks"
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        )

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            flat = [t for target in targets for t in ast.walk(target)]
            if any(isinstance(t, ast.Subscript) and is_table(t.value) for t in flat):
                found.append(f"{path.name}:{node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr in mutators and is_table(node.value):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_built_in_policy_writes_the_table() -> None:
    """Only the base writes ``self._blocks``; a built-in keeps its order in the hooks."""
    folder = Path(importlib.import_module("kvoffload.policies").__file__ or "").parent
    modules = sorted(p for p in folder.glob("*.py") if p.name != "base.py")
    assert len(modules) > 20
    assert [line for path in modules for line in _table_writes(path)] == []
    assert _table_writes(folder / "base.py") != []  # the check sees a write where there is one
