"""FIFO: exact libCacheSim equivalence, a pin-aware reference model, conformance, unit tests."""

from __future__ import annotations

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
from kvoffload.policies.fifo import FIFOCachePolicy
from kvoffload.testing import check_policy_conformance, int_key


def _theirs(capacity: int, block_ids: list[int]) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.FIFO(capacity, hashpower=16), block_ids)


class FifoModel:
    """Insertion order; evict the oldest ready, unpinned, unprotected blocks."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.state: dict[int, str] = {}

    def touch(self, block_id: int) -> None:
        pass

    def insert(self, block_id: int) -> None:
        self.order.append(block_id)
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def remove(self, block_id: int) -> None:
        self.order.remove(block_id)
        del self.state[block_id]

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        eligible = [i for i in self.order if self.state[i] == "ready" and i not in protected]
        if len(eligible) < n:
            return None
        for block_id in eligible[:n]:
            self.remove(block_id)
        return eligible[:n]


# ------------------------------------------------------------------ libCacheSim
def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(FIFOCachePolicy, _theirs, seed=101)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(FIFOCachePolicy, _theirs, flat_trace, fraction)


# ------------------------------------------------------------------ reference model
@pytest.mark.parametrize("capacity", [1, 2, 5, 16])
def test_matches_pin_aware_model(capacity: int) -> None:
    for seed in range(6):
        compared = run_against_model(FIFOCachePolicy(capacity), FifoModel(), seed)
        assert compared > 20


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(FIFOCachePolicy)


# ------------------------------------------------------------------ unit tests
def test_uses_do_not_change_the_order() -> None:
    policy = FIFOCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0), int_key(0)])
    assert victim_ids(policy.evict(2, set())) == [0, 1]


def test_a_pinned_block_keeps_its_place_in_the_queue() -> None:
    policy = FIFOCachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    pin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [1]
    unpin(policy, 0)  # a load is not a re-insertion: block 0 is still the oldest
    assert victim_ids(policy.evict(1, set())) == [0]


def test_pending_and_protected_blocks_are_skipped_and_failure_changes_nothing() -> None:
    policy = FIFOCachePolicy(4)
    pending = BlockStatus(3, -1)
    policy.insert(int_key(3), pending)  # the oldest block, but still being written
    for i in range(3):
        store_ready(policy, i)
    assert policy.evict(3, {int_key(0)}) is None  # only blocks 1 and 2 can go
    assert victim_ids(policy.evict(2, {int_key(0)})) == [1, 2]
    assert policy.evict(1, {int_key(0)}) is None
    assert policy.get(int_key(3)) is pending
    pending.ref_cnt = 0
    policy.mark_evictable(int_key(3))
    assert victim_ids(policy.evict(2, set())) == [3, 0]
