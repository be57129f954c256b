"""Bounds: brute-force optimality on small traces, libCacheSim's Belady on the shared trace."""

from __future__ import annotations

import random
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import libcachesim_hits, shared_trace_path

from kvoffload.sim.bounds import (
    TraceBounds,
    belady_hit_flags,
    belady_hits,
    infinite_cache_hits,
    max_live_blocks,
    next_use_positions,
    prefix_hits,
)
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.traces import load_trace


def brute_force_best(seq: tuple[int, ...], capacity: int, bypass: bool) -> int:
    """Most hits any policy can get, by trying every eviction (and admission) choice."""

    @cache
    def best(i: int, cache: frozenset[int]) -> int:
        if i == len(seq):
            return 0
        block = seq[i]
        if block in cache:
            return 1 + best(i + 1, cache)
        options = []
        if len(cache) < capacity:
            options.append(cache | {block})
        else:
            options.extend((cache - {victim}) | {block} for victim in cache)
        if bypass or capacity == 0:
            options.append(cache)
        return max(best(i + 1, option) for option in options)

    return best(0, frozenset())


small_traces = st.tuples(st.lists(st.integers(0, 5), min_size=0, max_size=14), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(small_traces)
def test_belady_is_the_best_demand_policy(case: tuple[list[int], int]) -> None:
    seq, capacity = case
    assert belady_hits(seq, capacity) == brute_force_best(tuple(seq), capacity, bypass=False)


@settings(max_examples=300, deadline=None)
@given(small_traces)
def test_opt_bypass_is_the_best_policy_with_admission(case: tuple[list[int], int]) -> None:
    seq, capacity = case
    assert belady_hits(seq, capacity, bypass=True) == brute_force_best(
        tuple(seq), capacity, bypass=True
    )


def test_order_of_the_bounds_on_random_traces() -> None:
    rng = random.Random(3)
    for _ in range(50):
        seq = [int(rng.paretovariate(1.1)) % 40 for _ in range(rng.randint(1, 400))]
        capacity = rng.randint(1, 30)
        nxt = next_use_positions(seq)
        demand = belady_hits(seq, capacity, next_use=nxt)
        bypass = belady_hits(seq, capacity, bypass=True, next_use=nxt)
        assert demand <= bypass <= infinite_cache_hits(seq)


def test_next_use_and_infinite_cache() -> None:
    seq = [1, 2, 1, 3, 2, 1]
    assert next_use_positions(seq) == [2, 4, 5, 6, 6, 6]
    assert infinite_cache_hits(seq) == 3
    assert belady_hits(seq, 0) == 0
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        belady_hits(seq, -1)


def test_max_live_is_where_opt_reaches_the_infinite_cache() -> None:
    rng = random.Random(11)
    for _ in range(40):
        seq = [rng.randrange(30) for _ in range(rng.randint(2, 300))]
        live = max_live_blocks(seq)
        ceiling = infinite_cache_hits(seq)
        assert belady_hits(seq, live, bypass=True) == ceiling
        if live > 0:
            assert belady_hits(seq, live - 1, bypass=True) < ceiling


def test_infinite_cache_prefix_hits_stop_at_the_first_new_block() -> None:
    requests = [
        TraceRequest("a", 0.0, [0, 1], 1024, 0, 512),
        TraceRequest("b", 0.0, [2, 1], 1024, 0, 512),  # 1 is a repeat, but after a new block
    ]
    bounds = TraceBounds(Trace(requests, 512, 3)).at(10)
    assert bounds.infinite_hit_ratio == 0.25 and bounds.infinite_prefix_hit_ratio == 0.0


def test_prefix_hits_count_each_requests_leading_run() -> None:
    requests = [
        TraceRequest("a", 0.0, [0, 1, 2], 1536, 0, 512),
        TraceRequest("b", 0.0, [0, 1, 3], 1536, 0, 512),
    ]
    trace = Trace(requests, 512, 4)
    assert prefix_hits(trace, [1, 0, 1, 1, 1, 0]) == 1 + 2
    flags = belady_hit_flags(trace.flat_block_ids(), 3)
    assert list(flags) == [0, 0, 0, 1, 1, 0]


def test_token_weighted_infinite_cache_counts_partial_tails() -> None:
    requests = [
        TraceRequest("a", 0.0, [0, 1], 600, 0, 88),
        TraceRequest("b", 0.0, [0, 1], 600, 0, 88),
    ]
    bounds = TraceBounds(Trace(requests, 512, 2)).at(10)
    assert bounds.infinite_hit_ratio == 0.5 and bounds.infinite_prefix_hit_ratio == 0.5
    assert bounds.infinite_token_hit_ratio == 600 / 1200


def test_shared_trace_bounds_match_libcachesim_and_the_readme() -> None:
    trace = load_trace(shared_trace_path())
    bounds = TraceBounds(trace)
    readme = {439: 0.1852, 2196: 0.3955, 4392: 0.5063, 10981: 0.6260}
    opt = {439: 0.1854, 2196: 0.3956, 4392: 0.5063, 10981: 0.6260}  # eviction_policies.md §3
    for capacity, ratio in readme.items():
        b = bounds.at(capacity)
        assert round(b.belady_hit_ratio, 4) == ratio
        assert round(b.opt_bypass_hit_ratio, 4) == opt[capacity]
        assert b.belady_prefix_hit_ratio == b.belady_hit_ratio  # OPT is prefix-closed here
    assert round(bounds.at(1).infinite_hit_ratio, 4) == 0.6396
    assert round(bounds.at(1).infinite_token_hit_ratio, 4) == 0.6512
    assert bounds.at(1).max_live_blocks == 12637
    lcs = pytest.importorskip("libcachesim")
    seq = trace.flat_block_ids()
    for capacity in (439, 4392):
        assert belady_hits(seq, capacity, next_use=bounds.next_use) == libcachesim_hits(
            lcs, "Belady", capacity, seq
        )
