"""2Q: exact libCacheSim equivalence, its one documented difference, conformance, unit tests."""

from __future__ import annotations

import pytest
from replay_helpers import (
    TRACE_FRACTIONS,
    assert_same_hits_on_random_sequences,
    assert_same_hits_on_trace,
    import_libcachesim,
    libcachesim_hits,
    pin,
    random_sequences,
    store_ready,
    victim_ids,
)

from kvoffload.policies.twoq import TwoQCachePolicy
from kvoffload.testing import check_policy_conformance, drive_single_blocks, int_key


def _theirs(capacity: int, block_ids: list[int], **params: float) -> int:
    lcs = import_libcachesim()
    return libcachesim_hits(lcs.TwoQ(capacity, hashpower=16, **params), block_ids)


# ------------------------------------------------------------------ libCacheSim
def test_matches_libcachesim_on_random_sequences() -> None:
    assert_same_hits_on_random_sequences(TwoQCachePolicy, _theirs, seed=21, capacity_range=(4, 24))


def test_matches_libcachesim_with_other_ratios() -> None:
    for capacity, ids in random_sequences(seed=22, count=60, capacity_range=(10, 30)):
        ours = drive_single_blocks(TwoQCachePolicy(capacity, a_in_ratio=0.4, a_out_ratio=1.5), ids)
        theirs = _theirs(capacity, ids, a_in_size_ratio=0.4, a_out_size_ratio=1.5)
        assert ours == theirs, (capacity, ids)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_libcachesim_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    assert_same_hits_on_trace(TwoQCachePolicy, _theirs, flat_trace, fraction)


def test_documented_difference_small_capacities_still_cache() -> None:
    """libCacheSim's A1in holds int(0.25 * c) = 0 objects below 4 blocks: it stores nothing."""
    ids = [1, 1, 2, 2, 1, 2, 3, 3, 1, 2] * 5
    for capacity in (1, 2, 3):
        assert _theirs(capacity, ids) == 0
        assert drive_single_blocks(TwoQCachePolicy(capacity), ids) > 0


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(TwoQCachePolicy)


def test_conformance_with_large_a1in_and_no_ghosts() -> None:
    check_policy_conformance(TwoQCachePolicy, seeds=(0, 1), a_in_ratio=0.75, a_out_ratio=0.0)


# ------------------------------------------------------------------ unit tests
def _full(capacity: int = 8) -> TwoQCachePolicy:
    policy = TwoQCachePolicy(capacity)
    for i in range(capacity):
        store_ready(policy, i)
    return policy


def test_hit_in_a1in_does_not_promote() -> None:
    policy = _full()
    policy.touch([int_key(0)])
    assert policy.stats()["a1in_size"] == 8
    assert victim_ids(policy.evict(1, set())) == [0]  # still FIFO: the re-use did not count


def test_a1out_ghost_hit_stores_into_am() -> None:
    policy = _full()
    assert victim_ids(policy.evict(1, set())) == [0]
    assert policy.stats()["a1out_size"] == 1
    policy.touch([int_key(0)])  # the miss finds the ghost
    assert policy.stats()["a1out_size"] == 0
    store_ready(policy, 0)
    assert policy.stats()["am_size"] == 1


def test_am_victims_leave_no_ghost_and_a1in_within_share_protects_it() -> None:
    policy = _full(8)  # A1in share: int(8 * 0.25) = 2 blocks; A1out: 4 keys
    assert victim_ids(policy.evict(4, set())) == [0, 1, 2, 3]  # A1in over share -> A1out
    for i in range(4):
        policy.touch([int_key(i)])
        store_ready(policy, i)  # ghost hits: straight into Am
    assert victim_ids(policy.evict(2, set())) == [4, 5]  # A1in (4 blocks) still over share
    assert policy.stats() == {"a1in_size": 2, "am_size": 4, "a1out_size": 2, "evictable": 6}
    # A1in (blocks 6, 7) is within its share now: Am's LRU block goes, without a ghost.
    assert victim_ids(policy.evict(1, set())) == [0]
    assert policy.stats()["a1out_size"] == 2


def test_pinned_and_protected_blocks_are_skipped() -> None:
    policy = _full(4)
    pin(policy, 0)
    assert victim_ids(policy.evict(2, {int_key(1)})) == [2, 3]
    assert policy.evict(1, {int_key(1)}) is None  # only the pinned and the protected remain


def test_all_a1in_pinned_falls_back_to_am() -> None:
    policy = TwoQCachePolicy(8)
    for i in range(8):
        store_ready(policy, i)
    policy.evict(1, set())  # block 0 -> A1out
    policy.touch([int_key(0)])
    store_ready(policy, 0)  # block 0 in Am
    for i in range(1, 8):
        pin(policy, i)
    assert victim_ids(policy.evict(1, set())) == [0]


def test_failed_evict_changes_nothing_and_remove_leaves_no_ghost() -> None:
    policy = _full(4)
    before = dict(policy.stats())
    assert policy.evict(5, set()) is None
    assert policy.stats() == before
    policy.remove(int_key(0))
    assert policy.get(int_key(0)) is None
    assert policy.stats()["a1out_size"] == 0


def test_ghosts_are_bounded_by_a_out_ratio() -> None:
    policy = TwoQCachePolicy(8)
    drive_single_blocks(policy, list(range(200)))
    assert policy.stats()["a1out_size"] == 4


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"a_in_ratio": -0.1}, ValueError),
        ({"a_in_ratio": 1.5}, ValueError),
        ({"a_out_ratio": -1.0}, ValueError),
        ({"a_out_ratio": 100.0}, ValueError),
        ({"a_in_ratio": "0.25"}, TypeError),
        ({"a_out_ratio": True}, TypeError),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(params))):
        TwoQCachePolicy(8, **params)  # type: ignore[arg-type]
