"""LRU: conformance, exact libCacheSim equivalence, a reference model and unit tests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from replay_helpers import (
    TRACE_FRACTIONS,
    assert_same_hits_on_random_sequences,
    assert_same_hits_on_trace,
)

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.testing import PolicyConformanceSuite, drive_single_blocks, int_key
from kvoffload.testing.libcachesim import libcachesim_hits as replay_libcachesim
from kvoffload.testing.libcachesim import make_cache

lcs = pytest.importorskip("libcachesim")


def libcachesim_hits(capacity: int, seq: list[int]) -> int:
    return replay_libcachesim(make_cache("LRU", capacity, 16), seq)


class TestLRUConformance(PolicyConformanceSuite):
    policy_cls = LRUCachePolicy


def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(LRUCachePolicy, libcachesim_hits, seed=7)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 10),
    seq=st.lists(st.integers(0, 25), min_size=1, max_size=300),
)
def test_matches_libcachesim_hypothesis(capacity: int, seq: list[int]) -> None:
    assert drive_single_blocks(LRUCachePolicy(capacity), seq) == libcachesim_hits(capacity, seq)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(LRUCachePolicy, libcachesim_hits, flat_trace, fraction)


def test_shared_trace_lru_figures_match_trace_readme(flat_trace: list[int]) -> None:
    expected = {0.01: 0.0343, 0.05: 0.1548, 0.10: 0.2598, 0.25: 0.4434}
    unique = len(set(flat_trace))
    for fraction, ratio in expected.items():
        hits = drive_single_blocks(LRUCachePolicy(int(unique * fraction)), flat_trace)
        assert round(hits / len(flat_trace), 4) == ratio


# ------------------------------------------------------------------ LRU unit tests
def _ready(policy: LRUCachePolicy, key: OffloadKey, slot: int) -> BlockStatus:
    status = BlockStatus(slot, -1)
    policy.insert(key, status)
    status.ref_cnt = 0
    policy.mark_evictable(key)
    return status


def test_lru_touch_orders_head_most_recent() -> None:
    policy = LRUCachePolicy(4)
    keys = [int_key(i) for i in range(4)]
    for slot, key in enumerate(keys):
        _ready(policy, key, slot)
    policy.touch([keys[1], keys[2]])  # a request whose prefix is 1, 2
    victims = policy.evict(4, set())
    assert victims is not None
    assert [k for k, _ in victims] == [keys[0], keys[3], keys[2], keys[1]]


def test_lru_pinned_and_pending_blocks_are_not_in_the_eviction_order() -> None:
    policy = LRUCachePolicy(8)
    statuses = [_ready(policy, int_key(i), i) for i in range(6)]
    for i in range(5):
        statuses[i].ref_cnt = 1
        policy.mark_non_evictable(int_key(i))
    policy.insert(int_key(99), BlockStatus(7, -1))
    assert policy.stats()["evictable"] == 1
    assert policy.evict(2, set()) is None
    victims = policy.evict(1, set())
    assert victims == [(int_key(5), statuses[5])]


def test_lru_unpinned_block_becomes_most_recent() -> None:
    policy = LRUCachePolicy(3)
    statuses = [_ready(policy, int_key(i), i) for i in range(3)]
    statuses[0].ref_cnt = 1
    policy.mark_non_evictable(int_key(0))
    statuses[0].ref_cnt = 0
    policy.mark_evictable(int_key(0))  # a finished load is a use
    victims = policy.evict(3, set())
    assert victims is not None
    assert [k for k, _ in victims] == [int_key(1), int_key(2), int_key(0)]


class LRUAgainstListModel(RuleBasedStateMachine):
    """Random protocol histories with pins: LRU's victims equal a naive list model's."""

    @initialize(capacity=st.integers(1, 6))
    def setup(self, capacity: int) -> None:
        self.policy = LRUCachePolicy(capacity)
        self.capacity = capacity
        self.status: dict[OffloadKey, BlockStatus] = {}
        self.order: list[OffloadKey] = []  # evictable keys, least recent first
        self.next_slot = 0
        self.next_id = 0

    def _touch_model(self, keys: list[OffloadKey]) -> None:
        for key in reversed(keys):
            if key in self.order:
                self.order.remove(key)
                self.order.append(key)

    @rule(count=st.integers(1, 3), data=st.data())
    def store(self, count: int, data: st.DataObject) -> None:
        keys = [int_key(self.next_id + i) for i in range(count)]
        self.next_id += count
        protected = set(keys) | set(
            data.draw(st.lists(st.sampled_from(sorted(self.status)), max_size=2))
            if self.status
            else []
        )
        need = len(self.status) + count - self.capacity
        if need > 0:
            eligible = [k for k in self.order if k not in protected]
            expected = eligible[:need] if len(eligible) >= need else None
            victims = self.policy.evict(need, protected)
            assert (None if victims is None else [k for k, _ in victims]) == expected
            if victims is None:
                return
            for key, _ in victims:
                self.order.remove(key)
                del self.status[key]
        for key in keys:
            status = BlockStatus(self.next_slot, -1)
            self.next_slot += 1
            self.status[key] = status
            self.policy.insert(key, status)

    @precondition(lambda self: any(s.ref_cnt == -1 for s in self.status.values()))
    @rule(data=st.data(), success=st.booleans())
    def complete(self, data: st.DataObject, success: bool) -> None:
        key = data.draw(
            st.sampled_from(sorted(k for k, s in self.status.items() if s.ref_cnt == -1))
        )
        if success:
            self.status[key].ref_cnt = 0
            self.policy.mark_evictable(key)
            self.order.append(key)
        else:
            del self.status[key]
            self.policy.remove(key)

    @precondition(lambda self: bool(self.status))
    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        keys = data.draw(
            st.lists(st.sampled_from(sorted(self.status)), min_size=1, max_size=3, unique=True)
        )
        self.policy.touch(keys)
        self._touch_model(keys)

    @precondition(lambda self: any(s.ref_cnt >= 0 for s in self.status.values()))
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        key = data.draw(
            st.sampled_from(sorted(k for k, s in self.status.items() if s.ref_cnt >= 0))
        )
        self.status[key].ref_cnt += 1
        if self.status[key].ref_cnt == 1:
            self.policy.mark_non_evictable(key)
            self.order.remove(key)

    @precondition(lambda self: any(s.ref_cnt > 0 for s in self.status.values()))
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, s in self.status.items() if s.ref_cnt > 0)))
        self.status[key].ref_cnt -= 1
        if self.status[key].ref_cnt == 0:
            self.policy.mark_evictable(key)
            self.order.append(key)

    @invariant()
    def table_matches(self) -> None:
        if not hasattr(self, "policy"):
            return
        for key, status in self.status.items():
            assert self.policy.get(key) is status
        assert self.policy.stats()["evictable"] == len(self.order)


TestLRUAgainstListModel = LRUAgainstListModel.TestCase
TestLRUAgainstListModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
