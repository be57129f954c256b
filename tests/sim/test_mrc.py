"""One-pass curves: stack distances against a naive LRU stack, the exact LRU curve against
``replay`` in blocks mode, sampled curves at full rate against full replays, warm-up and
windows against the replay's own."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import shared_trace_path

from kvoffload.sim.capacity import parse_capacities
from kvoffload.sim.mrc import exact_lru_curve, replayed_curve, sampled_curve
from kvoffload.sim.replay import PolicySpec, ReplayOptions, replay
from kvoffload.sim.stack_distance import stack_distances, stack_distances_fenwick
from kvoffload.sim.traces import load_trace
from kvoffload.sim.windows import Measure
from kvoffload.sim.workloads import WorkloadConfig, generate_workload


def naive_distances(ids: list[int]) -> list[int]:
    stack: list[int] = []
    out = []
    for block in ids:
        if block in stack:
            i = stack.index(block)
            out.append(len(stack) - 1 - i)
            stack.pop(i)
        else:
            out.append(-1)
        stack.append(block)
    return out


def naive_lru_hits(ids: list[int], capacity: int) -> int:
    cache: list[int] = []
    hits = 0
    for block in ids:
        if block in cache:
            hits += 1
            cache.remove(block)
        elif len(cache) >= capacity and cache:
            cache.pop(0)
        if capacity > 0:
            cache.append(block)
    return hits


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 25), max_size=120))
def test_stack_distances_match_a_naive_lru_stack(ids: list[int]) -> None:
    expected = naive_distances(ids)
    assert stack_distances_fenwick(ids) == expected
    assert list(stack_distances(ids)) == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=150), st.integers(0, 35))
def test_distances_below_capacity_are_lrus_hits(ids: list[int], capacity: int) -> None:
    distances = stack_distances_fenwick(ids)
    assert sum(0 <= d < capacity for d in distances) == naive_lru_hits(ids, capacity)


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("use_numpy", [True, False])
def test_exact_curve_equals_blocks_replay(seed: int, use_numpy: bool) -> None:
    trace = generate_workload(WorkloadConfig(seed=seed, requests=500))
    caps = parse_capacities("0,1,1%,5%,20%,60%,100%", trace.num_unique_blocks, 512)
    curve = exact_lru_curve(trace, caps, use_numpy=use_numpy)
    for point in curve.points:
        full = replay(trace, point.capacity_blocks, "lru", ReplayOptions(mode="blocks"))
        assert point.block_hits == full.block_hits
        assert point.prefix_hit_blocks == full.prefix_hit_blocks
        assert point.token_hits == full.token_hits
        assert point.block_accesses == full.block_accesses


def test_exact_curve_equals_blocks_replay_on_the_shared_trace() -> None:
    trace = load_trace(shared_trace_path())
    caps = parse_capacities("1%,5%,25%", trace.num_unique_blocks, trace.block_tokens)
    curve = exact_lru_curve(trace, caps)
    for point in curve.points:
        full = replay(trace, point.capacity_blocks, "lru", ReplayOptions(mode="blocks"))
        assert (point.block_hits, point.prefix_hit_blocks, point.token_hits) == (
            full.block_hits,
            full.prefix_hit_blocks,
            full.token_hits,
        )


@pytest.mark.parametrize("use_numpy", [True, False])
def test_warmup_and_windows_equal_the_replays(use_numpy: bool) -> None:
    trace = generate_workload(WorkloadConfig(seed=3, requests=400))
    caps = parse_capacities("2%,10%,50%", trace.num_unique_blocks, 512)
    measure = Measure(warmup_requests=40, warmup_s=30.0, window_s=45.0)
    curve = exact_lru_curve(trace, caps, measure, use_numpy=use_numpy)
    for point in curve.points:
        full = replay(trace, point.capacity_blocks, "lru", ReplayOptions("blocks", measure=measure))
        assert full.measured is not None
        assert full.requests < len(trace.requests)
        assert (point.block_hits, point.prefix_hit_blocks, point.token_hits) == (
            full.block_hits,
            full.prefix_hit_blocks,
            full.token_hits,
        )
        assert point.requests_full_hit == full.measured.requests_full_hit
        assert point.requests_any_hit == full.measured.requests_any_hit
        windows = [w for w in curve.windows if w.capacity_blocks == point.capacity_blocks]
        assert [(w.window, w.block_hits) for w in windows] == [
            (w.window, w.block_hits) for w in full.windows
        ]
        assert sum(w.block_hits or 0 for w in windows) == full.block_hits


def test_sampled_curve_at_full_rate_equals_full_replays() -> None:
    trace = generate_workload(WorkloadConfig(seed=1, requests=300))
    caps = parse_capacities("1%,5%", trace.num_unique_blocks, 512)
    specs = [PolicySpec("lru"), PolicySpec("arc"), PolicySpec("s3fifo")]
    curve = sampled_curve(trace, caps, specs, "blocks", sample_rate=1.0, min_blocks=0)
    for point in curve.points:
        full = replay(trace, point.capacity_blocks, point.policy, ReplayOptions(mode="blocks"))
        assert point.sample_rate == 1.0
        assert point.block_hit_ratio == pytest.approx(full.block_hit_ratio, abs=1e-12)


def test_sampled_curve_reports_rate_and_error_estimate() -> None:
    trace = generate_workload(WorkloadConfig(seed=2, requests=600))
    caps = parse_capacities("20%", trace.num_unique_blocks, 512)
    curve = sampled_curve(trace, caps, [PolicySpec("lru")], sample_rate=0.1, min_blocks=0, salts=3)
    (point,) = curve.points
    assert point.sample_rate == pytest.approx(0.1)
    assert point.samples == 3
    assert point.error_estimate is not None and point.error_estimate > 0
    exact = exact_lru_curve(trace, caps).points[0].block_hit_ratio
    assert abs(point.block_hit_ratio - exact) < 0.05


def test_prefix_mode_curve_is_the_prefix_replay() -> None:
    trace = generate_workload(WorkloadConfig(seed=4, requests=300))
    caps = parse_capacities("3%,30%", trace.num_unique_blocks, 512)
    curve = replayed_curve(trace, caps, "lru")
    for point in curve.points:
        full = replay(trace, point.capacity_blocks, "lru")
        assert point.prefix_hit_blocks == full.prefix_hit_blocks
        assert point.block_hits == full.block_hits


def test_the_draw_takes_the_hot_blocks_at_its_rate() -> None:
    # A generated trace numbers each prompt's blocks one after another; a hash whose draw
    # depends on that layout (CRC-32's: 0.91 of the rate here, for every salt alike) biases
    # every sampled curve the same way, and the salts' spread cannot show it.
    from collections import Counter
    from statistics import fmean

    from kvoffload.sim.mrc import draw_hashes

    trace = generate_workload(WorkloadConfig(seed=0, requests=20_000))
    counts = Counter(b for r in trace.requests for b in r.block_ids)
    hot = [block for block, _ in counts.most_common(500)]
    total = sum(counts[b] for b in hot)
    rate, threshold = 0.1, int(0.1 * (1 << 32))
    shares = []
    for salt in range(32):
        hashes = draw_hashes(max(hot) + 1, salt)
        shares.append(sum(counts[b] for b in hot if hashes[b] < threshold) / total / rate)
    assert 0.95 <= fmean(shares) <= 1.05
    assert len(set(draw_hashes(1000, 0))) > 990  # a 32-bit hash, not a few values


def test_lru_control_makes_lru_exact_and_moves_every_policy_alike() -> None:
    trace = generate_workload(WorkloadConfig(seed=2, requests=600))
    caps = parse_capacities("5%,20%", trace.num_unique_blocks, 512)
    specs = [PolicySpec("lru"), PolicySpec("arc")]
    plain = sampled_curve(trace, caps, specs, sample_rate=0.1, min_blocks=0)
    controlled = sampled_curve(trace, caps, specs, sample_rate=0.1, min_blocks=0, lru_control=True)
    exact = {p.capacity: p.block_hit_ratio for p in exact_lru_curve(trace, caps).points}
    raw = {(p.policy, p.capacity): p.block_hit_ratio for p in plain.points}
    for point in controlled.points:
        shift = raw[("lru", point.capacity)] - exact[point.capacity]
        assert shift != 0.0  # the sample's luck, which the control takes out
        expected = raw[(point.policy, point.capacity)] - shift
        assert point.block_hit_ratio == pytest.approx(expected, abs=1e-12)
    # LRU fed as the control without being asked for: only the policies asked for come back
    (only_arc,) = sampled_curve(
        trace, caps[:1], [PolicySpec("arc")], sample_rate=0.1, min_blocks=0, lru_control=True
    ).points
    assert only_arc.policy == "arc"
    assert only_arc.block_hit_ratio == pytest.approx(
        raw[("arc", caps[0].label)] - (raw[("lru", caps[0].label)] - exact[caps[0].label]),
        abs=1e-12,
    )
    with pytest.raises(ValueError, match="blocks"):
        sampled_curve(trace, caps, specs, "prefix", lru_control=True)


def test_fixed_size_and_miniature_bounds_lower_the_rate() -> None:
    trace = generate_workload(WorkloadConfig(seed=3, requests=400))
    caps = parse_capacities("5%,50%", trace.num_unique_blocks, 512)
    fixed = sampled_curve(
        trace,
        caps,
        [PolicySpec("lru")],
        sample_rate=0.5,
        min_blocks=0,
        max_sampled_blocks=trace.num_unique_blocks // 10,
        max_blocks=caps[1].blocks // 20,
    )
    small, big = fixed.points
    assert small.sample_rate == pytest.approx(0.1, rel=0.01)  # the draw's bound
    assert big.sample_rate == pytest.approx(0.05, rel=0.01)  # the miniature's bound
    with pytest.raises(ValueError, match="max_blocks"):
        sampled_curve(trace, caps, [PolicySpec("lru")], min_blocks=256, max_blocks=100)


def test_a_presampled_shadow_takes_every_key_it_is_given() -> None:
    from kvoffload.keys import int_key
    from kvoffload.selection.shadow import ShadowEvaluator

    keys = [int_key(i) for i in range(2000)]
    for presampled, fed in ((True, 2000), (False, None)):
        shadow = ShadowEvaluator(
            1000, ["lru"], sample_rate=0.01, protocol="blocks", presampled=presampled
        )
        count = shadow.record(keys)
        if fed is None:
            assert count < 100  # its own hash keeps about 1% of them
        else:
            assert count == fed and shadow.accesses == fed
