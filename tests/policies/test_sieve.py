"""SIEVE: exact libCacheSim equivalence, a step-by-step hand model with pins, unit tests."""

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
from kvoffload.policies.sieve import SieveCachePolicy
from kvoffload.testing import check_policy_conformance, int_key


def _theirs(capacity: int, block_ids: list[int]) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.Sieve(capacity, hashpower=16), block_ids)


class SieveModel:
    """A list, oldest first, and the hand as an index into it (``None``: start at 0)."""

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.visited: dict[int, bool] = {}
        self.state: dict[int, str] = {}
        self.hand: int | None = None

    def touch(self, block_id: int) -> None:
        if self.state.get(block_id) in ("ready", "pinned"):
            self.visited[block_id] = True

    def insert(self, block_id: int) -> None:
        self.queue.append(block_id)
        self.visited[block_id] = False
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def remove(self, block_id: int) -> None:
        self._drop(self.queue.index(block_id))

    def _drop(self, index: int) -> int:
        """Remove the block at ``index``; a hand on it moves to the next newer block."""
        block_id = self.queue.pop(index)
        del self.visited[block_id], self.state[block_id]
        if self.hand is not None:
            if index < self.hand:
                self.hand -= 1
            if self.hand == len(self.queue):
                self.hand = None
        return block_id

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        eligible = {i for i in self.queue if self.state[i] == "ready" and i not in protected}
        if len(eligible) < n:
            return None
        victims = []
        for _ in range(n):
            index = 0 if self.hand is None else self.hand
            while True:
                block_id = self.queue[index]
                if block_id in eligible:
                    if not self.visited[block_id]:
                        break
                    self.visited[block_id] = False
                index = (index + 1) % len(self.queue)
            self.hand = index
            victims.append(self._drop(index))
        return victims


# ------------------------------------------------------------------ libCacheSim
def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(SieveCachePolicy, _theirs, seed=103)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(SieveCachePolicy, _theirs, flat_trace, fraction)


# ------------------------------------------------------------------ reference model
@pytest.mark.parametrize("capacity", [1, 2, 4, 8, 16])
def test_matches_step_by_step_model_with_pins(capacity: int) -> None:
    for seed in range(6):
        assert run_against_model(SieveCachePolicy(capacity), SieveModel(), seed) > 20


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(SieveCachePolicy)


# ------------------------------------------------------------------ unit tests
def test_survivors_stay_in_place_and_the_hand_resumes_where_it_stopped() -> None:
    policy = SieveCachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(0), int_key(1), int_key(3)])
    assert victim_ids(policy.evict(1, set())) == [2]  # 0 and 1 lose their bit, 2 goes
    store_ready(policy, 4)  # the newest block; the hand rests on block 3
    policy.touch([int_key(0)])
    assert victim_ids(policy.evict(1, set())) == [4]  # 3 loses its bit, 4 goes
    assert victim_ids(policy.evict(1, set())) == [1]  # wrapped: 0 loses its bit again


def test_pinned_visited_block_is_passed_with_its_bit_unchanged() -> None:
    policy = SieveCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    pin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [1]
    unpin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [2]  # the hand continues from block 2
    store_ready(policy, 3)
    # The hand wrapped to block 0: its bit survived the pinned pass, so it is cleared now.
    assert victim_ids(policy.evict(1, set())) == [3]
    assert victim_ids(policy.evict(1, set())) == [0]


def test_failed_evict_keeps_bits_and_hand() -> None:
    policy, twin = SieveCachePolicy(4), SieveCachePolicy(4)
    for p in (policy, twin):
        for i in range(4):
            store_ready(p, i)
        p.touch([int_key(0), int_key(1)])
        pin(p, 3)
    assert policy.evict(4, set()) is None
    assert victim_ids(policy.evict(2, set())) == victim_ids(twin.evict(2, set())) == [2, 0]


def test_removing_the_block_under_the_hand_moves_the_hand_on() -> None:
    policy = SieveCachePolicy(4)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    assert victim_ids(policy.evict(1, set())) == [1]  # the hand rests on block 2
    pending = BlockStatus(9, -1)
    policy.insert(int_key(9), pending)
    policy.remove(int_key(2))  # under the hand: it moves to block 9
    pending.ref_cnt = 0
    policy.mark_evictable(int_key(9))
    assert victim_ids(policy.evict(1, set())) == [9]


def test_inserting_a_stored_key_is_an_error() -> None:
    policy = SieveCachePolicy(2)
    store_ready(policy, 0)
    with pytest.raises(ValueError, match="already stored"):
        policy.insert(int_key(0), BlockStatus(1, -1))
