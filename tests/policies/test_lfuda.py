"""LFUDA: the published rule against independent models; libCacheSim's different rule shown.

libCacheSim 0.3.5's ``LFUDA`` does not implement ``K = uses + L``: a use adds the current
floor ``L`` to the priority. ``libcachesim_rule_hits`` models that rule and reproduces
libCacheSim exactly; it also predicts the inputs on which libCacheSim crashes (small caches)
or runs away, and libCacheSim is only ever run in a child process, so a crash there cannot
take the test session down.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import OrderedDict

import pytest
from protocol_model_driver import run_against_model
from replay_helpers import (
    TRACE_FRACTIONS,
    import_libcachesim,
    manager_decisions,
    one_at_a_time,
    pin,
    random_sequences,
    store_ready,
    unpin,
    victim_ids,
)

from kvoffload.policies.lfu import LFUCachePolicy
from kvoffload.policies.lfuda import LFUDACachePolicy
from kvoffload.testing import check_policy_conformance, drive_single_blocks, int_key

_REPLAY_IN_CHILD = """
import json, sys
from kvoffload.testing.libcachesim import libcachesim_hits, make_cache
cases = json.load(sys.stdin)
json.dump([libcachesim_hits(make_cache("LFUDA", c, 16), ids) for c, ids in cases], sys.stdout)
"""


def libcachesim_lfuda_hits(cases: list[tuple[int, list[int]]]) -> list[int]:
    """Replay each ``(capacity, block ids)`` through libCacheSim's LFUDA in a child process."""
    import_libcachesim()
    done = subprocess.run(
        [sys.executable, "-c", _REPLAY_IN_CHILD],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"libCacheSim LFUDA failed ({done.returncode}): {done.stderr}"
    results: list[int] = json.loads(done.stdout)
    return results


class LFUDAModel:
    """Published LFUDA, by brute force: evict the smallest (priority, stamp)."""

    def __init__(self) -> None:
        self.clock = itertools.count()
        self.age = 0
        self.uses: dict[int, int] = {}
        self.priority: dict[int, int] = {}
        self.stamp: dict[int, int] = {}
        self.state: dict[int, str] = {}

    def touch(self, block_id: int) -> None:
        if self.state.get(block_id) in ("ready", "pinned"):
            self.uses[block_id] += 1
            self.priority[block_id] = self.uses[block_id] + self.age
            self.stamp[block_id] = next(self.clock)

    def insert(self, block_id: int) -> None:
        self.uses[block_id] = 1
        self.priority[block_id] = self.age + 1
        self.stamp[block_id] = next(self.clock)
        self.state[block_id] = "pending"

    def complete(self, block_id: int) -> None:
        self.state[block_id] = "ready"
        self.stamp[block_id] = next(self.clock)

    def remove(self, block_id: int) -> None:
        del self.uses[block_id], self.priority[block_id], self.stamp[block_id]
        del self.state[block_id]

    def pin(self, block_id: int) -> None:
        self.state[block_id] = "pinned"

    def unpin(self, block_id: int) -> None:
        self.complete(block_id)

    def evict(self, n: int, protected: set[int]) -> list[int] | None:
        eligible = [i for i, s in self.state.items() if s == "ready" and i not in protected]
        if len(eligible) < n:
            return None
        victims = sorted(eligible, key=lambda i: (self.priority[i], self.stamp[i]))[:n]
        if victims:
            self.age = self.priority[victims[-1]]
        for block_id in victims:
            self.remove(block_id)
        return victims


def published_lfuda_hits(capacity: int, block_ids: list[int]) -> int:
    """Published LFUDA, one block at a time, with buckets per priority (fast enough for traces)."""
    uses: dict[int, int] = {}
    priority: dict[int, int] = {}
    buckets: dict[int, OrderedDict[int, None]] = {}
    age = hits = 0

    def leave(block_id: int) -> None:
        bucket = buckets[priority[block_id]]
        del bucket[block_id]
        if not bucket:
            del buckets[priority[block_id]]

    for block_id in block_ids:
        if block_id in priority:
            hits += 1
            leave(block_id)
            uses[block_id] += 1
        else:
            if capacity == 0:
                continue
            if len(priority) >= capacity:
                age = min(buckets)
                victim = next(iter(buckets[age]))
                leave(victim)
                del priority[victim], uses[victim]
            uses[block_id] = 1
        priority[block_id] = uses[block_id] + age
        buckets.setdefault(priority[block_id], OrderedDict())[block_id] = None
    return hits


def libcachesim_rule_hits(capacity: int, block_ids: list[int]) -> int | None:
    """libCacheSim 0.3.5's LFUDA rule; ``None`` where libCacheSim crashes or runs away.

    ``floor`` is its ``min_freq``: a new block gets ``floor + 1``, a use *adds* ``floor``,
    eviction takes the oldest block of priority ``max(floor, 1)`` and sets ``floor`` to it,
    and when the blocks at ``floor`` run out (before a moving block lands), ``floor`` jumps to
    the next priority that still has blocks, if any. An empty bucket at eviction time is a
    NULL dereference there; a priority above 10**6 makes its integer-by-integer minimum search
    (or its doubling priorities) run away.
    """
    priority: dict[int, int] = {}
    buckets: dict[int, OrderedDict[int, None]] = {}
    floor = top = hits = 0

    def raise_floor() -> None:
        nonlocal floor
        above = [p for p, bucket in buckets.items() if bucket and floor < p <= top]
        if above:
            floor = min(above)

    def place(block_id: int, value: int) -> None:
        nonlocal top
        priority[block_id] = value
        top = max(top, value)
        buckets.setdefault(value, OrderedDict())[block_id] = None

    for block_id in block_ids:
        if block_id in priority:
            hits += 1
            old = priority[block_id]
            new = old + floor
            top = max(top, new)
            del buckets[old][block_id]
            if old == floor and not buckets[old]:
                raise_floor()
            place(block_id, new)
        else:
            if len(priority) >= capacity:
                lowest = max(floor, 1)
                bucket = buckets.get(lowest)
                if not bucket:
                    return None
                del priority[bucket.popitem(last=False)[0]]
                floor = lowest
                if not bucket:
                    raise_floor()
            place(block_id, floor + 1)
        if top > 10**6:
            return None
    return hits


# ------------------------------------------------------------------ published rule
def test_matches_published_models_on_random_sequences() -> None:
    for capacity, ids in random_sequences(seed=107, count=150, capacity_range=(1, 24)):
        ours = drive_single_blocks(LFUDACachePolicy(capacity), ids)
        assert ours == published_lfuda_hits(capacity, ids), (capacity, ids)


@pytest.mark.parametrize("fraction", TRACE_FRACTIONS)
def test_matches_published_model_on_shared_trace(fraction: float, flat_trace: list[int]) -> None:
    capacity = int(len(set(flat_trace)) * fraction)
    ours = drive_single_blocks(LFUDACachePolicy(capacity), flat_trace)
    assert ours == published_lfuda_hits(capacity, flat_trace)


@pytest.mark.parametrize("capacity", [1, 2, 5, 16])
def test_matches_pin_aware_model(capacity: int) -> None:
    for seed in range(6):
        assert run_against_model(LFUDACachePolicy(capacity), LFUDAModel(), seed) > 20


# ------------------------------------------------------------------ libCacheSim
def test_libcachesim_follows_its_own_rule() -> None:
    cases = []
    for capacity, ids in random_sequences(seed=108, count=200, capacity_range=(1, 24)):
        if libcachesim_rule_hits(capacity, ids) is not None:
            cases.append((capacity, ids))
    assert len(cases) > 100
    theirs = libcachesim_lfuda_hits(cases)
    assert theirs == [libcachesim_rule_hits(c, ids) for c, ids in cases]
    ours = [drive_single_blocks(LFUDACachePolicy(c), ids) for c, ids in cases]
    assert sum(a != b for a, b in zip(ours, theirs, strict=True)) > 10  # the rules really differ


def test_documented_difference_uses_before_the_first_eviction_count_for_nothing() -> None:
    ids = [0, 1, 2, 3, 4, 0, 0, 0, 5, 6, 7, 8, 9, 0]
    # Published: block 0 has priority 4, outlives the one-use blocks and hits at the end.
    assert drive_single_blocks(LFUDACachePolicy(5), ids) == published_lfuda_hits(5, ids) == 4
    # libCacheSim: the three uses added L = 0; block 0 is evicted like the others.
    assert libcachesim_lfuda_hits([(5, ids)]) == [libcachesim_rule_hits(5, ids)] == [3]


# ------------------------------------------------------------------ conformance
def test_conformance() -> None:
    check_policy_conformance(LFUDACachePolicy)


# ------------------------------------------------------------------ unit tests
def test_aging_lets_a_formerly_hot_block_go_where_lfu_keeps_it() -> None:
    hot_then_cold = [0] * 5 + [i for i in range(1, 40) for _ in range(2)] + [0]
    # LFU: block 0's five uses keep it forever; LFUDA: the age passes its priority.
    assert drive_single_blocks(LFUCachePolicy(3), hot_then_cold) == 4 + 39 + 1
    assert drive_single_blocks(LFUDACachePolicy(3), hot_then_cold) == 4 + 39


def test_victim_priority_becomes_the_cache_age() -> None:
    policy = LFUDACachePolicy(3)
    for i in range(3):
        store_ready(policy, i)
    policy.touch([int_key(0)])
    policy.touch([int_key(0)])  # priority 3
    policy.touch([int_key(1)])  # priority 2
    assert victim_ids(policy.evict(2, set())) == [2, 1]
    assert policy.cache_age == 2
    store_ready(policy, 3)  # priority 1 + 2 = 3: level with block 0, which is older
    assert victim_ids(policy.evict(1, set())) == [0]


def test_pinned_and_protected_blocks_are_skipped_and_failure_changes_nothing() -> None:
    policy = LFUDACachePolicy(4)
    for i in range(4):
        store_ready(policy, i)
    policy.touch([int_key(3)])
    pin(policy, 0)
    assert policy.evict(3, {int_key(1)}) is None
    assert policy.cache_age == 0
    assert victim_ids(policy.evict(1, {int_key(1)})) == [2]
    unpin(policy, 0)  # re-enters behind block 1 (same priority)
    assert victim_ids(policy.evict(3, set())) == [1, 0, 3]


# ------------------------------------------------------------------ batched calls
@pytest.mark.parametrize("capacity", [6, 40])
def test_batched_calls_decide_like_single_calls(capacity: int) -> None:
    batched = manager_decisions(LFUDACachePolicy(capacity), capacity)
    assert batched == manager_decisions(one_at_a_time(LFUDACachePolicy)(capacity), capacity)
