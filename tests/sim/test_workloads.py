"""The workload generator: seeded, prefix-chained, multi-turn, and far from optimal for LRU."""

from __future__ import annotations

import io
import itertools
import statistics
from collections import Counter
from pathlib import Path

import pytest

from kvoffload.policies import create_cache_policy
from kvoffload.sim.bounds import TraceBounds
from kvoffload.sim.capacity import parse_capacity
from kvoffload.sim.records import Trace
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import (
    WorkloadConfig,
    generate_workload,
    open_output,
    write_mooncake_jsonl,
)
from kvoffload.testing import drive_single_blocks

SMALL = WorkloadConfig(requests=400)


def signature(trace: Trace) -> list[tuple[float, tuple[int, ...], int, int]]:
    return [
        (r.timestamp_s, tuple(r.block_ids), r.input_tokens, r.output_tokens) for r in trace.requests
    ]


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    assert signature(generate_workload(SMALL)) == signature(generate_workload(SMALL))
    other = generate_workload(WorkloadConfig(requests=400, seed=1))
    assert signature(other) != signature(generate_workload(SMALL))


def test_shape_of_the_default_trace() -> None:
    trace = generate_workload(SMALL)
    assert len(trace.requests) == 400
    times = [r.timestamp_s for r in trace.requests]
    assert times == sorted(times) and times[0] == 0.0
    assert set(Counter(r.category for r in trace.requests)) == {"chat", "oneoff", "agent"}
    seen = {b for r in trace.requests for b in r.block_ids}
    assert seen == set(range(trace.num_unique_blocks))  # dense ids
    for r in trace.requests:
        n = len(r.block_ids)
        assert 512 * (n - 1) < r.input_tokens <= 512 * n
        assert r.last_block_tokens == r.input_tokens - 512 * (n - 1)


def test_ids_are_prefix_chained() -> None:
    """Equal id => equal predecessor (and so an equal whole prefix), as in Mooncake traces."""
    trace = generate_workload(WorkloadConfig(requests=1500))
    parent: dict[int, int | None] = {}
    for r in trace.requests:
        previous = None
        for block in r.block_ids:
            assert parent.setdefault(block, previous) == previous
            previous = block


def test_a_turn_extends_the_previous_turn_of_its_session() -> None:
    trace = generate_workload(WorkloadConfig(requests=1500, agent_weight=0.0, oneoff_weight=0.0))
    last: dict[str, tuple[float, list[int], int]] = {}
    follow_ups = 0
    for r in trace.requests:
        assert r.session_id is not None
        if r.session_id in last:
            t, ids, tokens = last[r.session_id]
            full = tokens // 512
            assert r.block_ids[:full] == ids[:full]  # the previous context's full blocks
            assert r.input_tokens > tokens and r.timestamp_s >= t
            if tokens % 512:  # the previous partial block grew: a new block
                assert r.block_ids[full] != ids[full]
            follow_ups += 1
        last[r.session_id] = (r.timestamp_s, r.block_ids, r.input_tokens)
    assert follow_ups > 500


def test_bursty_arrivals_are_burstier_than_poisson() -> None:
    def gap_cv(arrival: str) -> float:
        cfg = WorkloadConfig(requests=3000, arrival=arrival, chat_weight=0.0, agent_weight=0.0)
        times = [r.timestamp_s for r in generate_workload(cfg).requests]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    poisson, bursty = gap_cv("poisson"), gap_cv("bursty")
    assert 0.85 < poisson < 1.15  # exponential gaps
    assert bursty > poisson * 1.2


def test_default_mix_leaves_lru_far_from_optimal() -> None:
    """Like the real traces, LRU at 5% of unique blocks gets well under OPT's hits."""
    trace = generate_workload()
    capacity = parse_capacity("5%", trace.num_unique_blocks, trace.block_tokens).blocks
    seq = trace.flat_block_ids()
    lru = drive_single_blocks(create_cache_policy("lru", capacity), seq) / len(seq)
    bounds = TraceBounds(trace).at(capacity)
    assert lru < 0.7 * bounds.opt_bypass_hit_ratio
    assert 0.2 < bounds.infinite_hit_ratio < 0.8


def test_mooncake_jsonl_round_trip(tmp_path: Path) -> None:
    trace = generate_workload(SMALL)
    path = tmp_path / "w.jsonl.gz"
    with open_output(path) as out:
        assert write_mooncake_jsonl(trace, out) == 400
    back = load_trace(path)
    assert back.num_unique_blocks == trace.num_unique_blocks
    for a, b in zip(trace.requests, back.requests, strict=True):
        assert a.block_ids == b.block_ids and a.input_tokens == b.input_tokens
        assert a.last_block_tokens == b.last_block_tokens and a.session_id == b.session_id
        assert abs(a.timestamp_s - b.timestamp_s) <= 0.0005  # written in whole milliseconds
    strict = io.StringIO()
    write_mooncake_jsonl(trace, strict, extra_fields=False)
    assert '"session_id"' not in strict.getvalue()


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"requests": 0}, "requests must be >= 1"),
        ({"arrival": "uniform"}, "arrival must be"),
        ({"activity_rate": 0}, "activity_rate must be > 0"),
        ({"chat_weight": 0, "oneoff_weight": 0, "agent_weight": 0}, "at least one of"),
        ({"burst_fraction": 1.0}, "burst_fraction"),
    ],
)
def test_bad_knobs_are_rejected(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadConfig(**knobs)  # type: ignore[arg-type]


def _max_live_share(trace: Trace) -> float:
    """Most blocks waiting for a reuse at one time, as a share of the unique blocks."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    pos = 0
    for request in trace.requests:
        for block in request.block_ids:
            first.setdefault(block, pos)
            last[block] = pos
            pos += 1
    delta = [0] * (pos + 1)
    for block, start in first.items():
        if last[block] > start:
            delta[start] += 1
            delta[last[block]] -= 1
    live = best = 0
    for step in delta:
        live += step
        best = max(best, live)
    return best / trace.num_unique_blocks


def test_the_working_set_keeps_its_share_as_requests_grow() -> None:
    default = _max_live_share(generate_workload(WorkloadConfig()))
    bigger = generate_workload(WorkloadConfig(requests=8 * 1500))
    fixed_load = generate_workload(WorkloadConfig(requests=8 * 1500, reference_requests=0))
    assert _max_live_share(bigger) > 0.8 * default  # 6.9% at 1,500 and 200,000 requests: 6.3%
    assert _max_live_share(fixed_load) < 0.75 * default  # what it was: 0.4% at 200,000
    span = bigger.requests[-1].timestamp_s
    assert span < 1.5 * generate_workload(WorkloadConfig()).requests[-1].timestamp_s


def test_up_to_the_reference_size_the_workload_is_as_configured() -> None:
    for requests in (200, 1500):
        scaled = generate_workload(WorkloadConfig(requests=requests))
        unscaled = generate_workload(WorkloadConfig(requests=requests, reference_requests=0))
        assert [r.block_ids for r in scaled.requests] == [r.block_ids for r in unscaled.requests]
    assert WorkloadConfig(requests=3000).load_scale == 2.0
