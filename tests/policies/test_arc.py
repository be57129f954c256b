"""ARC: conformance, exact libCacheSim equivalence and unit tests."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import (
    TRACE_FRACTIONS,
    assert_same_hits_on_random_sequences,
    assert_same_hits_on_trace,
)

from kvoffload.keys import OffloadKey
from kvoffload.policies.arc import ARCCachePolicy
from kvoffload.policies.base import BlockStatus
from kvoffload.testing import PolicyConformanceSuite, drive_single_blocks, int_key
from kvoffload.testing.libcachesim import libcachesim_hits as replay_libcachesim
from kvoffload.testing.libcachesim import make_cache

lcs = pytest.importorskip("libcachesim")


def libcachesim_hits(capacity: int, seq: list[int]) -> int:
    return replay_libcachesim(make_cache("ARC", capacity, 16), seq)


class TestARCConformance(PolicyConformanceSuite):
    policy_cls = ARCCachePolicy


def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(ARCCachePolicy, libcachesim_hits, seed=7)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 10),
    seq=st.lists(st.integers(0, 25), min_size=1, max_size=300),
)
def test_matches_libcachesim_hypothesis(capacity: int, seq: list[int]) -> None:
    assert drive_single_blocks(ARCCachePolicy(capacity), seq) == libcachesim_hits(capacity, seq)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(ARCCachePolicy, libcachesim_hits, flat_trace, fraction)


# ------------------------------------------------------------------ helpers
def _ready(policy: ARCCachePolicy, key: OffloadKey, slot: int) -> BlockStatus:
    status = BlockStatus(slot, -1)
    policy.insert(key, status)
    status.ref_cnt = 0
    policy.mark_evictable(key)
    return status


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
