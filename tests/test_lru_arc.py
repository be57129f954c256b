"""LRU and ARC: conformance, exact libCacheSim equivalence, reference-model and unit tests."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvoffload.keys import OffloadKey
from kvoffload.policies.arc import ARCCachePolicy
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.testing import PolicyConformanceSuite, drive_single_blocks, int_key

lcs = pytest.importorskip("libcachesim")

LCS_CLASSES = {"lru": "LRU", "arc": "ARC"}
POLICIES = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


def libcachesim_hits(name: str, capacity: int, seq: list[int]) -> int:
    cache = getattr(lcs, LCS_CLASSES[name])(cache_size=capacity, hashpower=16)
    req = lcs.Request()
    req.obj_size = 1
    req.op = lcs.ReqOp.OP_READ
    hits = 0
    for i, oid in enumerate(seq):
        req.obj_id = oid
        req.clock_time = i
        hits += bool(cache.get(req))
    return hits


class TestLRUConformance(PolicyConformanceSuite):
    policy_cls = LRUCachePolicy


class TestARCConformance(PolicyConformanceSuite):
    policy_cls = ARCCachePolicy


@pytest.mark.parametrize("name", ["lru", "arc"])
def test_matches_libcachesim_on_random_sequences(name: str) -> None:
    rng = random.Random(7)
    for _ in range(150):
        universe = rng.randint(1, 60)
        capacity = rng.randint(1, 16)
        skewed = rng.random() < 0.5
        seq = [
            int(rng.paretovariate(1.2)) % universe if skewed else rng.randrange(universe)
            for _ in range(rng.randint(1, 500))
        ]
        ours = drive_single_blocks(POLICIES[name](capacity), seq)
        assert ours == libcachesim_hits(name, capacity, seq), (name, capacity, seq)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 10),
    seq=st.lists(st.integers(0, 25), min_size=1, max_size=300),
    name=st.sampled_from(["lru", "arc"]),
)
def test_matches_libcachesim_hypothesis(capacity: int, seq: list[int], name: str) -> None:
    assert drive_single_blocks(POLICIES[name](capacity), seq) == libcachesim_hits(
        name, capacity, seq
    )


@pytest.mark.parametrize("name", ["lru", "arc"])
@pytest.mark.parametrize("fraction", [0.01, 0.05, 0.10, 0.25])
def test_matches_libcachesim_on_shared_trace(
    name: str, fraction: float, flat_trace: list[int]
) -> None:
    capacity = int(len(set(flat_trace)) * fraction)
    ours = drive_single_blocks(POLICIES[name](capacity), flat_trace)
    assert ours == libcachesim_hits(name, capacity, flat_trace)


def test_shared_trace_lru_figures_match_trace_readme(flat_trace: list[int]) -> None:
    expected = {0.01: 0.0343, 0.05: 0.1548, 0.10: 0.2598, 0.25: 0.4434}
    unique = len(set(flat_trace))
    for fraction, ratio in expected.items():
        hits = drive_single_blocks(LRUCachePolicy(int(unique * fraction)), flat_trace)
        assert round(hits / len(flat_trace), 4) == ratio


# ------------------------------------------------------------------ LRU unit tests
def _ready(policy: LRUCachePolicy | ARCCachePolicy, key: OffloadKey, slot: int) -> BlockStatus:
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


# ------------------------------------------------------------------ ARC unit tests
def _arc_full(capacity: int) -> ARCCachePolicy:
    policy = ARCCachePolicy(capacity)
    for i in range(capacity):
        _ready(policy, int_key(i), i)
    return policy


def test_arc_new_blocks_enter_t1_and_a_second_access_promotes() -> None:
    policy = _arc_full(4)
    assert policy.stats()["t1_size"] == 4
    policy.touch([int_key(0)])
    assert policy.stats()["t1_size"] == 3
    assert policy.stats()["t2_size"] == 1


def test_arc_pending_block_is_not_promoted() -> None:
    policy = ARCCachePolicy(4)
    policy.insert(int_key(0), BlockStatus(0, -1))
    policy.touch([int_key(0)])
    assert policy.stats()["t1_size"] == 1


def test_arc_b1_ghost_hit_raises_target_and_lands_in_t2() -> None:
    policy = _arc_full(2)
    victims = policy.evict(1, {int_key(9)})
    assert victims is not None and victims[0][0] == int_key(0)
    assert policy.stats()["b1_size"] == 1
    policy.touch([int_key(0)])  # miss that hits the B1 ghost
    assert policy.target_t1_size == 1.0
    policy.evict(1, {int_key(0)})
    policy.insert(int_key(0), BlockStatus(0, -1))
    assert policy.stats()["t2_size"] == 1
    assert policy.stats()["b1_size"] == 1


def test_arc_target_selects_the_list_to_evict_from() -> None:
    policy = _arc_full(3)
    policy.touch([int_key(0)])  # 0 -> T2
    # p = 0 and |T1| = 2 > p: evict from T1's LRU end into B1.
    victims = policy.evict(1, set())
    assert victims is not None and victims[0][0] == int_key(1)
    policy.touch([int_key(1)])  # ghost hit in B1: p -> 1
    # |T1| = 1 is not > p = 1 and the missed key is not in B2: evict from T2.
    victims = policy.evict(1, {int_key(1)})
    assert victims is not None and victims[0][0] == int_key(0)
    assert policy.stats()["b2_size"] == 1


def test_arc_failed_store_keeps_evictee_in_b1_and_new_key_absent() -> None:
    policy = _arc_full(3)
    policy.touch([int_key(0)])  # T2 = {0}, T1 = {1, 2}: the evictee of T1 keeps a ghost
    victims = policy.evict(1, {int_key(5)})
    assert victims is not None
    policy.insert(int_key(5), BlockStatus(victims[0][1].block_id, -1))
    policy.remove(int_key(5))
    assert policy.get(int_key(5)) is None
    assert policy.stats()["b1_size"] == 1
    assert policy.stats()["t1_size"] == 1


def test_arc_full_t1_drops_its_lru_without_a_ghost() -> None:
    """FAST'03 case IV-A: |T1| = c and a new key arrives -> T1's LRU leaves no ghost."""
    policy = _arc_full(2)
    policy.evict(1, {int_key(5)})
    policy.insert(int_key(5), BlockStatus(0, -1))
    assert policy.stats()["b1_size"] == 0


def test_arc_ghost_lists_stay_bounded_by_capacity() -> None:
    capacity = 5
    policy = ARCCachePolicy(capacity)
    rng = random.Random(3)
    drive_single_blocks(policy, [rng.randrange(200) for _ in range(5000)])
    stats = policy.stats()
    assert stats["t1_size"] + stats["b1_size"] <= capacity
    assert stats["t1_size"] + stats["t2_size"] + stats["b1_size"] + stats["b2_size"] <= 2 * capacity


def test_arc_pinned_blocks_cannot_be_evicted() -> None:
    policy = _arc_full(2)
    for i in range(2):
        policy.get(int_key(i)).ref_cnt = 1  # type: ignore[union-attr]
        policy.mark_non_evictable(int_key(i))
    assert policy.evict(1, set()) is None


def test_arc_clear_resets_target() -> None:
    policy = _arc_full(2)
    policy.evict(1, set())
    policy.touch([int_key(0)])
    assert policy.target_t1_size > 0
    policy.clear()
    assert policy.target_t1_size == 0
    assert all(v == 0 for v in policy.stats().values())


# --------------------------------------------- hypothesis: LRU against a list model
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


def test_arc_closed_form_plan_equals_step_by_step_replace() -> None:
    rng = random.Random(11)
    checked = 0
    for _ in range(300):
        capacity = rng.randint(1, 12)
        policy = ARCCachePolicy(capacity)
        sequence = [rng.randrange(3 * capacity) for _ in range(rng.randint(0, 80))]
        drive_single_blocks(policy, sequence)
        for n in range(0, capacity + 2):
            for missed_in_b2 in (False, True):
                fast = policy._plan_without_protection(n, missed_in_b2)
                if fast is not None:
                    assert fast == policy._plan(n, set(), missed_in_b2)
                    checked += 1
    assert checked > 1000
