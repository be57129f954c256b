"""SLRU / S4LRU: a list model, libCacheSim equivalence where it holds, documented differences."""

from __future__ import annotations

from typing import Any

import pytest
from replay_helpers import (
    import_libcachesim,
    libcachesim_hits,
    pin,
    random_sequences,
    store_ready,
    unpin,
    victim_ids,
)

from kvoffload.policies.slru import SLRUCachePolicy, segment_limits
from kvoffload.testing import check_policy_conformance, drive_single_blocks, int_key

#: libCacheSim 0.3.5's ``SLRU``: four equal levels, warm-up blocks fill free levels.
S4LRU: dict[str, Any] = {"num_segments": 4, "protected_ratio": 0.75, "fill_free_segments": True}


class ListSLRU:
    """Segmented LRU on plain lists (LRU first), one access at a time."""

    def __init__(
        self,
        capacity: int,
        num_segments: int = 2,
        protected_ratio: float = 0.8,
        fill_free_segments: bool = False,
    ) -> None:
        each = int(capacity * protected_ratio / (num_segments - 1))
        self.limits = [capacity - each * (num_segments - 1)] + [each] * (num_segments - 1)
        self.capacity = capacity
        self.fill = fill_free_segments
        self.segments: list[list[int]] = [[] for _ in range(num_segments)]

    def access(self, block: int) -> bool:
        top = len(self.segments) - 1
        for level, segment in enumerate(self.segments):
            if block in segment:
                segment.remove(block)
                level = min(level + 1, top)
                self.segments[level].append(block)
                while level > 0 and len(self.segments[level]) > self.limits[level]:
                    self.segments[level - 1].append(self.segments[level].pop(0))
                    level -= 1
                return True
        if self.capacity == 0:
            return False
        if sum(len(s) for s in self.segments) == self.capacity:
            next(s for s in self.segments if s).pop(0)
        level = 0
        if self.fill:
            level = next((i for i, s in enumerate(self.segments) if len(s) < self.limits[i]), 0)
        self.segments[level].append(block)
        return False


def _model_hits(capacity: int, ids: list[int], **params: object) -> int:
    model = ListSLRU(capacity, **params)  # type: ignore[arg-type]
    return sum(model.access(i) for i in ids)


def _theirs(capacity: int, ids: list[int]) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.SLRU(capacity, hashpower=16), ids)


# ------------------------------------------------------------------ reference model
@pytest.mark.parametrize(
    "params",
    [
        {},
        {"num_segments": 3, "protected_ratio": 0.6},
        {"num_segments": 4, "protected_ratio": 0.75},
        S4LRU,
    ],
)
def test_matches_list_model(params: dict[str, object]) -> None:
    for capacity, ids in random_sequences(seed=31, count=80, capacity_range=(1, 20)):
        ours = drive_single_blocks(SLRUCachePolicy(capacity, **params), ids)  # type: ignore[arg-type]
        assert ours == _model_hits(capacity, ids, **params), (capacity, ids)


# ------------------------------------------------------------------ libCacheSim
def test_matches_libcachesim_s4lru_when_capacity_is_a_multiple_of_4() -> None:
    for capacity, ids in random_sequences(seed=32, count=150, capacity_range=(1, 6)):
        capacity *= 4
        assert drive_single_blocks(SLRUCachePolicy(capacity, **S4LRU), ids) == _theirs(
            capacity, ids
        ), (capacity, ids)


@pytest.mark.parametrize("fraction", [0.05, 0.10])
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    capacity = int(len(set(flat_trace)) * fraction)
    assert capacity % 4 == 0  # 2196 and 4392 blocks
    ours = drive_single_blocks(SLRUCachePolicy(capacity, **S4LRU), flat_trace)
    assert ours == _theirs(capacity, flat_trace)


def test_documented_difference_libcachesim_evicts_on_a_hit() -> None:
    """Capacity 6: levels of int(6/4) = 1, probation overflows; the hit on 4 then evicts 0."""
    ids = [0, 2, 3, 6, 4, 4, 0]
    assert _theirs(6, ids) == 1
    ours = drive_single_blocks(SLRUCachePolicy(6, **S4LRU), ids)
    assert ours == 2 == _model_hits(6, ids, **S4LRU)


def test_documented_difference_small_capacities_store_nothing_in_libcachesim() -> None:
    ids = [1, 1, 2, 2, 1, 1] * 4
    for capacity in (1, 2, 3):
        assert _theirs(capacity, ids) == 0
        assert drive_single_blocks(SLRUCachePolicy(capacity, **S4LRU), ids) > 0


def test_documented_difference_warmup_fill_rule_costs_hits(flat_trace: list[int]) -> None:
    """libCacheSim's fill rule parks warm-up blocks in protected levels, where they linger."""
    capacity = int(len(set(flat_trace)) * 0.05)
    ours = drive_single_blocks(
        SLRUCachePolicy(capacity, num_segments=4, protected_ratio=0.75), flat_trace
    )
    assert ours > _theirs(capacity, flat_trace)


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(SLRUCachePolicy)


def test_conformance_s4lru_with_fill() -> None:
    check_policy_conformance(SLRUCachePolicy, seeds=(0, 1), **S4LRU)


# ------------------------------------------------------------------ unit tests
def test_segment_limits_add_up_to_the_capacity() -> None:
    assert segment_limits(10, 2, 0.8) == [2, 8]
    assert segment_limits(10, 4, 0.75) == [4, 2, 2, 2]
    assert segment_limits(2196, 4, 0.75) == [549] * 4
    for capacity in range(0, 50):
        assert sum(segment_limits(capacity, 3, 0.5)) == capacity


def test_hits_climb_one_level_and_overflow_cascades_down() -> None:
    policy = SLRUCachePolicy(4, num_segments=3, protected_ratio=0.5)  # limits [2, 1, 1]
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    policy.touch([int_key(1)])  # level 1 over its share: block 0 goes back to probation's MRU
    assert policy.segment_sizes == (3, 1, 0)
    policy.touch([int_key(1)])  # top level
    policy.touch([int_key(2)])
    assert policy.segment_sizes == (2, 1, 1)
    assert victim_ids(policy.evict(4, set())) == [3, 0, 2, 1]


def test_eviction_skips_pinned_and_protected_probation_blocks() -> None:
    policy = SLRUCachePolicy(4)  # limits [1, 3]
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(3)])
    pin(policy, 0)
    assert victim_ids(policy.evict(2, {int_key(1)})) == [2, 3]
    assert policy.evict(1, {int_key(1)}) is None
    unpin(policy, 0)
    assert victim_ids(policy.evict(1, {int_key(1)})) == [0]


def test_unpinned_block_reenters_its_level_at_the_mru_end() -> None:
    policy = SLRUCachePolicy(6)
    for i in range(3):
        store_ready(policy, i)
    pin(policy, 0)
    unpin(policy, 0)
    assert victim_ids(policy.evict(3, set())) == [1, 2, 0]


def test_fill_free_segments_places_warmup_blocks_in_free_levels() -> None:
    policy = SLRUCachePolicy(8, **S4LRU)  # four levels of 2
    for i in range(5):
        store_ready(policy, i)
    assert policy.segment_sizes == (2, 2, 1, 0)
    published = SLRUCachePolicy(8, num_segments=4, protected_ratio=0.75)
    for i in range(5):
        store_ready(published, i)
    assert published.segment_sizes == (5, 0, 0, 0)


def test_failed_evict_and_remove_leave_no_trace() -> None:
    policy = SLRUCachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(1)])
    assert policy.evict(5, set()) is None
    assert policy.segment_sizes == (3, 1)
    policy.remove(int_key(1))
    assert policy.segment_sizes == (3, 0)
    assert policy.get(int_key(1)) is None


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"num_segments": 1}, ValueError),
        ({"num_segments": 65}, ValueError),
        ({"num_segments": 2.0}, TypeError),
        ({"protected_ratio": 1.0}, ValueError),
        ({"protected_ratio": -0.1}, ValueError),
        ({"protected_ratio": "0.8"}, TypeError),
        ({"fill_free_segments": 1}, TypeError),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(params))):
        SLRUCachePolicy(8, **params)  # type: ignore[arg-type]
