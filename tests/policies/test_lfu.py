"""LFU: exact libCacheSim equivalence (tie-break included), a pin-aware model, unit tests."""

from __future__ import annotations

import itertools

import pytest
from protocol_model_driver import run_against_model
from replay_helpers import (
    TRACE_FRACTIONS,
    assert_same_hits_on_random_sequences,
    assert_same_hits_on_trace,
    import_libcachesim,
    libcachesim_hits,
    pin,
    store_ready,
    unpin,
    victim_ids,
)

from kvoffload.policies.base import BlockStatus
from kvoffload.policies.lfu import LFUCachePolicy
from kvoffload.testing import check_policy_conformance, drive_single_blocks, int_key


def _theirs(capacity: int, block_ids: list[int]) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.LFU(capacity, hashpower=16), block_ids)


class LFUModel:
    """Evict the smallest (count, stamp); ``stamp`` is when the block last got its place."""

    def __init__(self, tie_break: str = "last use") -> None:
        self.tie_break = tie_break  # "last use" (ours, libCacheSim) or "insertion"
        self.clock = itertools.count()
        self.count: dict[int, int] = {}
        self.stamp: dict[int, int] = {}
        self.state: dict[int, str] = {}

    def touch(self, block_id: int) -> None:
        if self.state.get(block_id) in ("ready", "pinned"):
            self.count[block_id] += 1
            if self.tie_break == "last use":
                self.stamp[block_id] = next(self.clock)

    def insert(self, block_id: int) -> None:
        self.count[block_id] = 1
        self.stamp[block_id] = next(self.clock)
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"
        self.stamp[block_id] = next(self.clock)

    def remove(self, block_id: int) -> None:
        del self.count[block_id], self.stamp[block_id], self.state[block_id]

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.complete(block_id)  # a completed load re-enters behind the blocks of its count

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        eligible = [i for i, s in self.state.items() if s == "ready" and i not in protected]
        if len(eligible) < n:
            return None
        victims = sorted(eligible, key=lambda i: (self.count[i], self.stamp[i]))[:n]
        for block_id in victims:
            self.remove(block_id)
        return victims

    def hits(self, capacity: int, block_ids: list[int]) -> int:
        hits = 0
        for block_id in block_ids:
            if block_id in self.state:
                hits += 1
                self.touch(block_id)
                continue
            if len(self.state) >= capacity:
                self.evict(1, set())
            self.insert(block_id)
            self.complete(block_id)
        return hits


# ------------------------------------------------------------------ libCacheSim
def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(LFUCachePolicy, _theirs, seed=106)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(LFUCachePolicy, _theirs, flat_trace, fraction)


def test_libcachesim_breaks_ties_by_last_use_not_by_insertion() -> None:
    """Among equal counts the block that reached the count first goes (block 2, not 0)."""
    ids = [0, 1, 2, 2, 0, 1, 3, 2]  # all reach count 2 in the order 2, 0, 1; then 3 misses
    assert _theirs(3, ids) == LFUModel("last use").hits(3, ids) == 3  # 2 went: 2 misses
    assert LFUModel("insertion").hits(3, ids) == 4  # FIFO by insertion would evict 0
    assert drive_single_blocks(LFUCachePolicy(3), ids) == 3


# ------------------------------------------------------------------ reference model
@pytest.mark.parametrize("capacity", [1, 2, 5, 16])
def test_matches_pin_aware_model(capacity: int) -> None:
    for seed in range(6):
        assert run_against_model(LFUCachePolicy(capacity), LFUModel(), seed) > 20


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(LFUCachePolicy)


# ------------------------------------------------------------------ unit tests
def test_fewest_uses_go_first() -> None:
    policy = LFUCachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(0), int_key(1)])
    policy.touch([int_key(0)])
    assert victim_ids(policy.evict(3, set())) == [2, 3, 1]


def test_a_request_touch_leaves_its_head_most_recent() -> None:
    policy = LFUCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0), int_key(1), int_key(2)])  # walked tail to head
    assert victim_ids(policy.evict(3, set())) == [2, 1, 0]


def test_pinned_least_used_block_is_skipped_and_rejoins_behind_its_equals() -> None:
    policy = LFUCachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    pin(policy, 0)
    policy.touch([int_key(0)])  # a use while pinned still counts
    policy.touch([int_key(1)])
    unpin(policy, 0)
    assert victim_ids(policy.evict(3, set())) == [2, 3, 1]  # 0 and 1 have 2 uses; 0 last


def test_pending_blocks_are_not_counted_or_evicted() -> None:
    policy = LFUCachePolicy(3)
    pending = BlockStatus(0, -1)
    policy.insert(int_key(0), pending)
    store_ready(policy, 1)
    policy.touch([int_key(0)])  # ignored: the block is still being written
    assert victim_ids(policy.evict(1, set())) == [1]
    assert policy.evict(1, set()) is None
    pending.ref_cnt = 0
    policy.mark_evictable(int_key(0))
    store_ready(policy, 2)
    policy.touch([int_key(2)])
    assert victim_ids(policy.evict(1, set())) == [0]


def test_failed_evict_and_protected_blocks() -> None:
    policy = LFUCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(2)])
    assert policy.evict(3, {int_key(0)}) is None
    assert victim_ids(policy.evict(2, {int_key(0)})) == [1, 2]
    assert policy.stats() == {"blocks": 1, "evictable": 1}
