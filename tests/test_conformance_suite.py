"""The conformance suite catches each rule's violation (one deliberately broken policy each)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

import pytest

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, Victims
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.testing import ConformanceError, PolicyConformanceSuite, check_policy_conformance


class IgnoresProtection(LRUCachePolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        return super().evict(n, ())


class EvictsPinned(LRUCachePolicy):
    def mark_non_evictable(self, key: OffloadKey) -> None:
        pass


class EvictsPending(LRUCachePolicy):
    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        super().insert(key, block, req_context)
        self._evictable[key] = None


class ReturnsPartialList(LRUCachePolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        victims = super().evict(n, protected)
        if victims is None and n > 1:
            return super().evict(1, protected)
        return victims


class ReturnsOneExtra(LRUCachePolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        victims = super().evict(n, protected)
        if victims and n >= 1:
            extra = super().evict(1, protected)
            if extra:
                victims += extra
        return victims


class ReordersOnFailedEvict(LRUCachePolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        victims = super().evict(n, protected)
        if victims is None and self._evictable:
            first = next(iter(self._evictable))
            self._evictable.move_to_end(first)  # "looked at it": a state change on failure
        return victims


class ImpureGet(LRUCachePolicy):
    def get(self, key: OffloadKey) -> BlockStatus | None:
        if key in self._evictable:
            self._evictable.move_to_end(key)
        return super().get(key)


class RemoveKeepsBlock(LRUCachePolicy):
    def remove(self, key: OffloadKey) -> None:
        self._evictable.pop(key, None)  # forgets to drop the block itself


class RemoveKeepsHistory(LRUCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.removed: dict[OffloadKey, int] = {}

    def remove(self, key: OffloadKey) -> None:
        super().remove(key)
        self.removed[key] = 1

    def clear(self) -> None:
        super().clear()
        self.removed.clear()


class ClearKeepsHistory(LRUCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.seen: dict[OffloadKey, int] = {}

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = list(keys)
        for key in keys:
            if len(self.seen) < 2 * self.cache_capacity:
                self.seen[key] = self.seen.get(key, 0) + 1
        super().touch(keys, req_context)


class UnboundedGhosts(LRUCachePolicy):
    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.ghosts: set[OffloadKey] = set()

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        victims = super().evict(n, protected)
        for key, _ in victims or ():
            self.ghosts.add(key)
        return victims

    def clear(self) -> None:
        super().clear()
        self.ghosts.clear()


class BatchInsertsReversed(LRUCachePolicy):
    def insert_many(self, keys, blocks, req_context=None):  # type: ignore[no-untyped-def]
        for key, block in reversed(list(zip(keys, blocks, strict=True))):
            self.insert(key, block, req_context)

    def mark_evictable_many(self, keys):  # type: ignore[no-untyped-def]
        for key in reversed(list(keys)):
            self.mark_evictable(key)


class RefusesWhenTwoNeeded(LRUCachePolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        return None if n >= 2 else super().evict(n, protected)


@pytest.mark.parametrize(
    ("policy_cls", "rule"),
    [
        (IgnoresProtection, "never evict protected"),
        (EvictsPinned, "never evict pinned"),
        (EvictsPending, "never evict pending"),
        (ReturnsPartialList, "evict returns exactly n"),
        (ReturnsOneExtra, "evict returns exactly n"),
        (ReordersOnFailedEvict, "a failed evict changes nothing"),
        (ImpureGet, "get is pure"),
        (RemoveKeepsBlock, "remove leaves no trace"),
        (RemoveKeepsHistory, "remove leaves no trace"),
        (ClearKeepsHistory, "clear resets everything"),
        (UnboundedGhosts, "history stays bounded"),
        (BatchInsertsReversed, "batched calls behave like single calls"),
        (RefusesWhenTwoNeeded, "evict succeeds when it can"),
    ],
)
def test_suite_catches_each_broken_policy(policy_cls: type[LRUCachePolicy], rule: str) -> None:
    with pytest.raises(ConformanceError, match=rule):
        check_policy_conformance(policy_cls)


def test_refusal_can_be_allowed_explicitly() -> None:
    check_policy_conformance(RefusesWhenTwoNeeded, allow_refusal=True)


class TestSuiteClassFormOnLRU(PolicyConformanceSuite):
    policy_cls = LRUCachePolicy


def test_class_form_reports_violations() -> None:
    class Broken(PolicyConformanceSuite):
        policy_cls = ImpureGet

    with pytest.raises(ConformanceError, match="get is pure"):
        Broken().test_get_is_pure()
