"""CLOCK: exact libCacheSim equivalence, a step-by-step hand model with pins, unit tests."""

from __future__ import annotations

from collections import deque

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

from kvoffload.policies.clock import ClockCachePolicy
from kvoffload.testing import check_policy_conformance, int_key

COUNTER_SETTINGS = [
    {"n_bit_counter": 1, "init_freq": 0},  # libCacheSim's default: the classic CLOCK
    {"n_bit_counter": 1, "init_freq": 1},
    {"n_bit_counter": 2, "init_freq": 1},
    {"n_bit_counter": 3, "init_freq": 0},
]


def _theirs(capacity: int, block_ids: list[int], **params: int) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.Clock(capacity, hashpower=16, **params), block_ids)


class ClockModel:
    """The hand moves one block at a time over a deque whose front is under it."""

    def __init__(self, n_bit_counter: int = 1, init_freq: int = 0) -> None:
        self.top = 2**n_bit_counter - 1
        self.init_freq = init_freq
        self.ring: deque[int] = deque()
        self.counter: dict[int, int] = {}
        self.state: dict[int, str] = {}

    def touch(self, block_id: int) -> None:
        if self.state.get(block_id) in ("ready", "pinned"):
            self.counter[block_id] = min(self.top, self.counter[block_id] + 1)

    def insert(self, block_id: int) -> None:
        self.ring.append(block_id)
        self.counter[block_id] = self.init_freq
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def remove(self, block_id: int) -> None:
        self.ring.remove(block_id)
        del self.counter[block_id], self.state[block_id]

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        eligible = [i for i in self.ring if self.state[i] == "ready" and i not in protected]
        if len(eligible) < n:
            return None
        victims: list[int] = []
        while len(victims) < n:
            block_id = self.ring[0]
            if block_id not in eligible:
                self.ring.rotate(-1)  # the hand passes a pinned/pending/protected block
            elif self.counter[block_id] > 0:
                self.counter[block_id] -= 1
                self.ring.rotate(-1)
            else:
                self.ring.popleft()
                del self.counter[block_id], self.state[block_id]
                victims.append(block_id)
        return victims


# ------------------------------------------------------------------ libCacheSim
@pytest.mark.parametrize("params", COUNTER_SETTINGS)
def test_matches_libcachesim_on_random_sequences(params: dict[str, int]) -> None:
    assert_same_hits_on_random_sequences(
        lambda capacity: ClockCachePolicy(capacity, **params),
        lambda capacity, ids: _theirs(capacity, ids, **params),
        seed=102,
        count=100,
    )


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(ClockCachePolicy, _theirs, flat_trace, fraction)


# ------------------------------------------------------------------ reference model
@pytest.mark.parametrize("params", COUNTER_SETTINGS)
@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_matches_step_by_step_model_with_pins(params: dict[str, int], capacity: int) -> None:
    for seed in range(5):
        policy = ClockCachePolicy(capacity, **params)
        assert run_against_model(policy, ClockModel(**params), seed) > 20


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(ClockCachePolicy)


def test_conformance_with_wider_counters() -> None:
    check_policy_conformance(ClockCachePolicy, seeds=(0, 1), n_bit_counter=2, init_freq=1)


# ------------------------------------------------------------------ unit tests
def test_second_chance() -> None:
    policy = ClockCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    assert victim_ids(policy.evict(1, set())) == [1]  # 0 had its bit: cleared, passed over
    store_ready(policy, 3)
    assert victim_ids(policy.evict(1, set())) == [2]
    assert victim_ids(policy.evict(1, set())) == [0]  # its bit was used up


def test_pinned_block_under_the_hand_is_passed_with_its_bit_unchanged() -> None:
    policy = ClockCachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    pin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [1]
    unpin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [2]
    store_ready(policy, 3)
    # Had the hand cleared block 0's bit while it was pinned, block 0 would go now.
    assert victim_ids(policy.evict(1, set())) == [3]
    assert victim_ids(policy.evict(1, set())) == [0]


def test_protected_block_keeps_its_bit() -> None:
    policy = ClockCachePolicy(2)
    store_ready(policy, 0)
    store_ready(policy, 1)
    policy.touch([int_key(0)])
    assert victim_ids(policy.evict(1, {int_key(0)})) == [1]
    store_ready(policy, 2)
    assert victim_ids(policy.evict(1, set())) == [2]  # 0's bit survived: it gets a pass


def test_failed_evict_changes_no_bit_and_no_hand_position() -> None:
    policy = ClockCachePolicy(4)
    twin = ClockCachePolicy(4)
    for p in (policy, twin):
        for i in range(4):
            store_ready(p, i)
        p.touch([int_key(0), int_key(2)])
        pin(p, 3)
    assert policy.evict(4, set()) is None  # blocks 0-2 only; the sweep would clear bits
    assert victim_ids(policy.evict(2, set())) == victim_ids(twin.evict(2, set())) == [1, 0]


def test_wide_counters_need_several_sweeps() -> None:
    policy = ClockCachePolicy(2, n_bit_counter=2)
    store_ready(policy, 0)
    store_ready(policy, 1)
    policy.touch([int_key(0)])
    policy.touch([int_key(0)])
    policy.touch([int_key(1)])
    assert victim_ids(policy.evict(1, set())) == [1]  # 1: 1 -> 0 on sweep 1, taken on sweep 2
    assert policy.evict(1, {int_key(0)}) is None


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"n_bit_counter": 0}, ValueError),
        ({"n_bit_counter": 17}, ValueError),
        ({"init_freq": -1}, ValueError),
        ({"init_freq": 2}, ValueError),  # above 2**1 - 1
        ({"n_bit_counter": 1.5}, TypeError),
        ({"init_freq": True}, TypeError),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(params))):
        ClockCachePolicy(8, **params)  # type: ignore[arg-type]
