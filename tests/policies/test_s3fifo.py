"""S3-FIFO: the paper's rule against an independent model, libCacheSim's documented differences.

``S3FIFOModel`` below is written from the SOSP'23 paper (plus the pin rules documented in
:mod:`kvoffload.policies.s3fifo`). With ``libcachesim_warmup=True`` it adds libCacheSim
0.3.5's warm-up rule (before the first eviction, once S is full, new blocks go straight to
M); that variant reproduces libCacheSim exactly, which shows that the warm-up rule is the
only difference between libCacheSim and the paper rule our policy follows.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import pytest
from protocol_model_driver import run_against_model
from replay_helpers import (
    TRACE_FRACTIONS,
    import_libcachesim,
    libcachesim_hits,
    manager_decisions,
    one_at_a_time,
    pin,
    random_sequences,
    store_ready,
    unpin,
    victim_ids,
)

from kvoffload.policies.base import BlockStatus
from kvoffload.policies.s3fifo import S3FIFOCachePolicy
from kvoffload.testing import check_policy_conformance, drive_single_blocks, int_key

PARAM_SETTINGS: list[dict[str, Any]] = [
    {},
    {"move_to_main_threshold": 1},
    {"move_to_main_threshold": 3, "small_size_ratio": 0.25, "ghost_size_ratio": 0.5},
    {"small_size_ratio": 0.5, "ghost_size_ratio": 0.0},
]


def _theirs(capacity: int, block_ids: list[int], **params: float) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.S3FIFO(capacity, hashpower=16, **params), block_ids)


class S3FIFOModel:
    """Small FIFO S, main FIFO M with 2-bit counters, ghost FIFO G; one victim at a time."""

    def __init__(
        self,
        capacity: int,
        *,
        move_to_main_threshold: int = 2,
        small_size_ratio: float = 0.1,
        ghost_size_ratio: float = 0.9,
        libcachesim_warmup: bool = False,
    ) -> None:
        self.capacity = capacity
        self.threshold = move_to_main_threshold
        self.small_limit = max(1, int(capacity * small_size_ratio))
        self.ghost_limit = int(capacity * ghost_size_ratio)
        self.libcachesim_warmup = libcachesim_warmup
        self.evicted_once = False
        self.small: list[int] = []
        self.main: deque[int] = deque()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.ghost_hits: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}
        self.state: dict[int, str] = {}

    # protocol steps
    def touch(self, block_id: int) -> None:
        if block_id in self.state:
            if self.state[block_id] != "pending":
                self.freq[block_id] = min(3, self.freq[block_id] + 1)
        elif self.ghost.pop(block_id, 0) is None:  # the miss finds its ghost
            self.ghost_hits[block_id] = None
            if len(self.ghost_hits) > max(1, self.capacity):
                self.ghost_hits.popitem(last=False)

    def insert(self, block_id: int) -> None:
        ghost_hit = self.ghost_hits.pop(block_id, 0) is None
        ghost_hit |= self.ghost.pop(block_id, 0) is None
        warmup = (
            self.libcachesim_warmup
            and not self.evicted_once
            and len(self.small) >= self.small_limit
        )
        (self.main.append if ghost_hit or warmup else self.small.append)(block_id)
        self.freq[block_id] = 0
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def remove(self, block_id: int) -> None:
        (self.small if block_id in self.small else self.main).remove(block_id)
        del self.freq[block_id], self.state[block_id]

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.state[block_id] = "ready"

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        def eligible(block_id: int) -> bool:
            return self.state[block_id] == "ready" and block_id not in protected

        if sum(map(eligible, self.state)) < n:
            return None
        self.evicted_once = self.evicted_once or n > 0
        return [self._evict_one(eligible) for _ in range(n)]

    def _evict_one(self, eligible: Callable[[int], bool]) -> int:
        if len(self.small) >= self.small_limit or not any(map(eligible, self.main)):
            index = 0
            while index < len(self.small):
                block_id = self.small[index]
                if self.freq[block_id] >= self.threshold:  # promoted, pinned or not
                    del self.small[index]
                    self.main.append(block_id)
                    self.freq[block_id] = 0
                elif eligible(block_id):
                    del self.small[index]
                    self._forget(block_id)
                    self.ghost[block_id] = None
                    while len(self.ghost) > self.ghost_limit:
                        self.ghost.popitem(last=False)
                    return block_id
                else:
                    index += 1  # pinned / pending / protected: keeps its place in S
        while True:
            block_id = self.main[0]
            self.main.rotate(-1)
            if eligible(block_id):
                if self.freq[block_id] == 0:
                    self.main.pop()
                    self._forget(block_id)
                    return block_id
                self.freq[block_id] -= 1

    def _forget(self, block_id: int) -> None:
        del self.freq[block_id], self.state[block_id]

    # single-block replay (the libCacheSim protocol)
    def hits(self, block_ids: list[int]) -> int:
        hits = 0
        for block_id in block_ids:
            if block_id in self.state:
                hits += 1
                self.touch(block_id)
                continue
            self.touch(block_id)
            if self.capacity == 0:
                continue
            if len(self.state) >= self.capacity:  # no pins here: every stored block can go
                self.evicted_once = True
                self._evict_one(lambda _: True)
            self.insert(block_id)
            self.complete(block_id)
        return hits


# ------------------------------------------------------------------ paper-rule model
@pytest.mark.parametrize("params", PARAM_SETTINGS)
def test_matches_paper_model_on_random_sequences(params: dict[str, Any]) -> None:
    for capacity, ids in random_sequences(seed=104, count=120, capacity_range=(1, 40)):
        ours = drive_single_blocks(S3FIFOCachePolicy(capacity, **params), ids)
        assert ours == S3FIFOModel(capacity, **params).hits(ids), (params, capacity, ids)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_paper_model_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    capacity = int(len(set(flat_trace)) * fraction)
    ours = drive_single_blocks(S3FIFOCachePolicy(capacity), flat_trace)
    assert ours == S3FIFOModel(capacity).hits(flat_trace)


@pytest.mark.parametrize("params", PARAM_SETTINGS)
@pytest.mark.parametrize("capacity", [1, 4, 12, 30])
def test_matches_step_by_step_model_with_pins(params: dict[str, Any], capacity: int) -> None:
    for seed in range(4):
        model = S3FIFOModel(capacity, **params)
        policy = S3FIFOCachePolicy(capacity, **params)
        assert run_against_model(policy, model, seed) > 20


# ------------------------------------------------------------------ libCacheSim
@pytest.mark.parametrize("params", PARAM_SETTINGS)
def test_libcachesim_is_the_paper_rule_plus_its_warmup_rule(params: dict[str, Any]) -> None:
    """On every capacity whose small FIFO holds >= 2 blocks (see the next test for 1)."""
    compared = 0
    for capacity, ids in random_sequences(seed=105, count=120, capacity_range=(10, 60)):
        model = S3FIFOModel(capacity, libcachesim_warmup=True, **params)
        if model.small_limit < 2:
            continue
        assert _theirs(capacity, ids, **params) == model.hits(ids), (params, capacity, ids)
        compared += 1
    assert compared > 50


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_libcachesim_on_shared_trace_is_the_warmup_variant(
    fraction: float, flat_trace: list[int]
) -> None:
    capacity = int(len(set(flat_trace)) * fraction)
    model = S3FIFOModel(capacity, libcachesim_warmup=True)
    assert _theirs(capacity, flat_trace) == model.hits(flat_trace)


def test_documented_difference_warmup_blocks_skip_the_small_fifo() -> None:
    """libCacheSim puts blocks 2..19 straight into M (S is full with block 0, 1): no filter."""
    capacity = 20
    warmup = list(range(20))  # fills the cache: S = [0, 1], M = [2..19] in libCacheSim
    scan = list(range(100, 120))  # one-use blocks
    ids = warmup + scan + warmup
    ours = drive_single_blocks(S3FIFOCachePolicy(capacity), ids)
    theirs = _theirs(capacity, ids)
    # Paper rule: the scan flushes the one-use warm-up blocks through S, nothing survives.
    assert ours == S3FIFOModel(capacity).hits(ids) == 0
    # libCacheSim: the scan only cycles through S, so the 18 warm-up blocks in M stay.
    assert theirs == S3FIFOModel(capacity, libcachesim_warmup=True).hits(ids) == 18


def test_documented_difference_small_fifo_of_one_block() -> None:
    """With int(0.1 * capacity) == 1, libCacheSim refuses every block that is not a ghost hit."""
    ids = [1, 2, 1, 2, 1, 2, 3, 1, 2, 3] * 4
    for capacity in (10, 15, 19):
        assert _theirs(capacity, ids) == 0
        assert drive_single_blocks(S3FIFOCachePolicy(capacity), ids) == len(ids) - 3


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(S3FIFOCachePolicy)


@pytest.mark.parametrize("params", PARAM_SETTINGS[1:])
def test_conformance_with_other_parameters(params: dict[str, Any]) -> None:
    check_policy_conformance(S3FIFOCachePolicy, seeds=(0, 1), **params)


# ------------------------------------------------------------------ unit tests
def _full(capacity: int = 10) -> S3FIFOCachePolicy:
    policy = S3FIFOCachePolicy(capacity)  # S share: 1 block, G: 9 keys
    for i in range(capacity):
        store_ready(policy, i)
    return policy


def test_one_use_blocks_leave_through_the_ghost_and_come_back_to_main() -> None:
    policy = _full()
    assert victim_ids(policy.evict(1, set())) == [0]
    assert policy.stats()["ghost_size"] == 1
    policy.touch([int_key(0)])  # the miss finds its ghost
    store_ready(policy, 0)
    assert policy.stats() == {"small_size": 9, "main_size": 1, "ghost_size": 0, "evictable": 10}


def test_reused_small_block_is_promoted_and_reinserted_in_main() -> None:
    policy = _full()
    policy.touch([int_key(0)])
    policy.touch([int_key(0)])  # two uses: promoted when it reaches S's old end
    policy.touch([int_key(1)])  # one use: not enough
    assert victim_ids(policy.evict(1, set())) == [1]
    assert policy.stats()["main_size"] == 1
    # S (8 blocks) is over its share: its old end keeps going, never the main block.
    assert victim_ids(policy.evict(8, set())) == [2, 3, 4, 5, 6, 7, 8, 9]
    assert victim_ids(policy.evict(1, set())) == [0]  # main: counter was reset to 0


def test_pinned_small_block_with_uses_is_promoted_without_being_evicted() -> None:
    policy = _full()
    policy.touch([int_key(0)])
    policy.touch([int_key(0)])
    pin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [1]
    assert policy.stats()["main_size"] == 1  # block 0 moved to M while pinned
    unpin(policy, 0)
    assert victim_ids(policy.evict(8, set())) == [2, 3, 4, 5, 6, 7, 8, 9]


def test_pinned_small_block_without_uses_keeps_its_place() -> None:
    policy = _full()
    pin(policy, 0)
    assert victim_ids(policy.evict(2, {int_key(1)})) == [2, 3]
    unpin(policy, 0)
    assert victim_ids(policy.evict(1, set())) == [0]  # still S's oldest block


def test_failed_evict_changes_no_queue_counter_or_ghost() -> None:
    policy, twin = _full(), _full()
    for p in (policy, twin):
        p.touch([int_key(0), int_key(0), int_key(5)])
        pin(p, 9)
    before = dict(policy.stats())
    assert policy.evict(10, set()) is None  # would promote block 0 and fill G first
    assert policy.stats() == before
    assert victim_ids(policy.evict(9, set())) == victim_ids(twin.evict(9, set()))


def test_removed_block_leaves_no_ghost() -> None:
    policy = S3FIFOCachePolicy(10)
    policy.insert(int_key(0), BlockStatus(0, -1))
    policy.remove(int_key(0))
    assert policy.stats() == {"small_size": 0, "main_size": 0, "ghost_size": 0, "evictable": 0}


def test_ghost_is_bounded() -> None:
    policy = S3FIFOCachePolicy(20, ghost_size_ratio=0.5)
    drive_single_blocks(policy, list(range(500)))
    assert policy.stats()["ghost_size"] == 10


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"small_size_ratio": 0.0}, ValueError),
        ({"small_size_ratio": 1.0}, ValueError),
        ({"ghost_size_ratio": -0.5}, ValueError),
        ({"ghost_size_ratio": float("nan")}, ValueError),
        ({"move_to_main_threshold": 0}, ValueError),
        ({"move_to_main_threshold": 4}, ValueError),
        ({"small_size_ratio": "0.1"}, TypeError),
        ({"move_to_main_threshold": 2.0}, TypeError),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(params))):
        S3FIFOCachePolicy(10, **params)  # type: ignore[arg-type]


# ------------------------------------------------------------------ batched calls
@pytest.mark.parametrize("capacity", [6, 40])
@pytest.mark.parametrize("params", PARAM_SETTINGS)
def test_batched_calls_decide_like_single_calls(capacity: int, params: dict[str, Any]) -> None:
    batched = manager_decisions(S3FIFOCachePolicy(capacity, **params), capacity)
    assert batched == manager_decisions(
        one_at_a_time(S3FIFOCachePolicy)(capacity, **params), capacity
    )
