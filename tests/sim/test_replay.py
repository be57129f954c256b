"""Replay through the real manager: libCacheSim equivalence, reference figures, exact counts."""

from __future__ import annotations

import pytest
from sim_helpers import SYNTHETIC_UNIQUE_BLOCKS, libcachesim_hits, shared_trace_path

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies import BlockStatus
from kvoffload.policies.lru import LRUCachePolicy
from kvoffload.sim.hit_lengths import summarize_hit_lengths
from kvoffload.sim.plugins import AdmissionFactory
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.replay import PolicySpec, ReplayOptions, replay
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload
from kvoffload.testing import int_key

BLOCKS = ReplayOptions(mode="blocks")
LCS_NAMES = {"lru": "LRU", "arc": "ARC"}


def request(
    rid: str, ids: list[int], last: int = 512, t: float = 0.0, out: int = 0
) -> TraceRequest:
    return TraceRequest(rid, t, ids, 512 * (len(ids) - 1) + last, out, last, session_id="s")


def make_trace(*requests: TraceRequest) -> Trace:
    unique = len({b for r in requests for b in r.block_ids})
    return Trace(list(requests), 512, unique)


@pytest.fixture(scope="module")
def shared_trace() -> Trace:
    return load_trace(shared_trace_path())


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_blocks_mode_equals_libcachesim_on_the_shared_trace(
    policy: str, shared_trace: Trace
) -> None:
    lcs = pytest.importorskip("libcachesim")
    seq = shared_trace.flat_block_ids()
    for fraction in (0.01, 0.05, 0.10, 0.25):
        capacity = int(SYNTHETIC_UNIQUE_BLOCKS * fraction)
        result = replay(shared_trace, capacity, policy, BLOCKS)
        assert result.block_hits == libcachesim_hits(lcs, LCS_NAMES[policy], capacity, seq)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", [1, 2])
def test_blocks_mode_equals_libcachesim_on_generated_workloads(policy: str, seed: int) -> None:
    lcs = pytest.importorskip("libcachesim")
    trace = generate_workload(WorkloadConfig(seed=seed, requests=500, arrival="bursty"))
    seq = trace.flat_block_ids()
    for capacity in (50, trace.num_unique_blocks // 20):
        result = replay(trace, capacity, policy, BLOCKS)
        assert result.block_hits == libcachesim_hits(lcs, LCS_NAMES[policy], capacity, seq)


def test_prefix_mode_lru_reproduces_tail_first_release_figures(shared_trace: Trace) -> None:
    """eviction_policies.md §2.4, synthetic, 'LRU pinned, tail-first'."""
    expected = {0.01: 0.0381, 0.05: 0.1566, 0.10: 0.2623, 0.25: 0.4441}
    for fraction, ratio in expected.items():
        result = replay(shared_trace, int(SYNTHETIC_UNIQUE_BLOCKS * fraction), "lru")
        assert round(result.prefix_hit_ratio, 4) == ratio
        assert result.block_hits == result.prefix_hit_blocks  # tail-first: every hit usable
        assert result.store_failures == 0


def test_prefix_mode_counts_on_a_hand_made_trace() -> None:
    trace = make_trace(
        request("r1", [0, 1, 2], last=100),  # 3 misses, stored
        request("r2", [0, 1, 3]),  # prefix hit 2 (pinned); 3 stored, evicting 2
        request("r3", [4, 1]),  # 1 is stored but not a usable prefix: a block hit only
    )
    result = replay(trace, 3, "lru")
    assert (result.block_hits, result.prefix_hit_blocks) == (3, 2)
    assert result.token_hits == 2 * 512 and result.tokens == 1124 + 1536 + 1024
    assert (result.stored_blocks, result.evictions, result.store_failures) == (5, 2, 0)
    assert result.hit_lengths.histogram == {"0": 2, "2-3": 1}
    blocks = replay(trace, 3, "lru", BLOCKS)
    assert (blocks.block_hits, blocks.prefix_hit_blocks) == (3, 2)


def test_a_store_that_cannot_fit_fails_and_is_counted() -> None:
    trace = make_trace(request("r1", [0, 1]), request("r2", [0, 1, 2, 3]))
    result = replay(trace, 3, "lru")  # r2 pins 0, 1 and needs 2 more slots: only 1 exists
    assert result.prefix_hit_blocks == 2
    assert (result.store_failures, result.store_failed_blocks) == (1, 2)
    partial = replay(trace, 3, "lru", ReplayOptions(partial_store=True))
    assert partial.store_failures == 0 and partial.stored_blocks == 3


def test_token_hits_count_a_partial_last_block() -> None:
    trace = make_trace(request("a", [0, 1], last=10), request("b", [0, 1], last=10))
    result = replay(trace, 10, "lru")
    assert result.token_hits == 522 and result.token_hit_ratio == 522 / 1044


def test_overlap_keeps_running_requests_pinned() -> None:
    trace = generate_workload(WorkloadConfig(requests=300))
    capacity = 60
    sequential = replay(trace, capacity, "lru")
    instant = replay(
        trace,
        capacity,
        "lru",
        ReplayOptions(overlap=True, prefill_tokens_per_s=1e12, decode_tokens_per_s=1e12),
    )
    assert instant.to_dict()["block_hits"] == sequential.block_hits  # no overlap at all
    assert instant.stored_blocks == sequential.stored_blocks
    slow = replay(trace, capacity, "lru", ReplayOptions(overlap=True, decode_tokens_per_s=5))
    assert slow.store_failures > sequential.store_failures
    assert slow.overlap and slow.to_dict()["overlap"] is True


def test_overlap_sees_pending_stores_of_running_requests() -> None:
    trace = make_trace(request("a", [0, 1], t=0.0, out=100), request("b", [0, 1, 2], t=1.0))
    result = replay(trace, 10, "lru", ReplayOptions(overlap=True, decode_tokens_per_s=10))
    assert result.pending_hits == 2 and result.block_hits == 0
    assert result.store_failures == 0 and result.stored_blocks == 3  # 2 new in b, 0/1 pending


def test_overlap_needs_time_order() -> None:
    trace = make_trace(request("a", [0], t=5.0), request("b", [1], t=1.0))
    with pytest.raises(ValueError, match=r"time order.*'b'"):
        replay(trace, 4, "lru", ReplayOptions(overlap=True))


def test_admission_options_are_passed_through() -> None:
    trace = generate_workload(WorkloadConfig(requests=300))
    base = replay(trace, 200, "lru")
    skip = replay(trace, 200, "lru", ReplayOptions(skip_partial_tail=True))
    tails = sum(1 for r in trace.requests if r.last_block_tokens < 512)
    assert 0 < skip.admission_rejected_blocks <= tails
    assert skip.stored_blocks < base.stored_blocks
    second = replay(trace, 200, "lru", ReplayOptions(store_threshold=2))
    assert second.admission_rejected_blocks > 0
    custom = replay(
        trace,
        200,
        "lru",
        ReplayOptions(admission=AdmissionFactory("kvoffload.admission:SkipPartialTail")),
    )
    assert custom.admission_rejected_blocks == skip.admission_rejected_blocks


def test_bytes_are_reported_with_bytes_per_token() -> None:
    trace = make_trace(request("a", [0, 1]), request("b", [2, 3]))
    result = replay(trace, 2, "lru", ReplayOptions(bytes_per_token=4))
    record = result.to_dict()
    assert record["stored_bytes"] == 4 * 512 * 4 and record["evicted_bytes"] == 2 * 512 * 4
    assert replay(trace, 2, "lru").to_dict()["stored_bytes"] is None


def test_repeated_keys_in_one_request() -> None:
    trace = make_trace(request("a", [0, 1, 0]))
    blocks = replay(trace, 4, "lru", BLOCKS)
    assert blocks.block_hits == 1  # the repeat is an independent access, as in libCacheSim
    prefix = replay(trace, 4, "lru")
    assert prefix.block_hits == 0 and prefix.stored_blocks == 2


class RecordingLRU(LRUCachePolicy):
    """LRU that records the request hints it is given (resolved by 'module:Class')."""

    seen: list[tuple[str, float | None, str | None, int | None, bool, int, list[int | None]]] = []
    prompts: list[int | None] = []
    finished: list[tuple[str, int | None]] = []

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        ctx = req_context
        assert ctx is not None
        keys = [int_key(i) for i in range(4)]
        RecordingLRU.seen.append(
            (
                ctx.req_id,
                ctx.timestamp,
                ctx.session_id,
                ctx.num_blocks,
                ctx.partial_tail_key == key,
                ctx.prefix_hit_blocks,
                [ctx.get_offload_key_position(k) for k in keys],
            )
        )
        RecordingLRU.prompts.append(ctx.prompt_tokens)
        super().insert(key, block, req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        RecordingLRU.finished.append((req_context.req_id, req_context.output_tokens))


@pytest.mark.parametrize("options", [ReplayOptions(), ReplayOptions(overlap=True), BLOCKS])
def test_policies_see_the_request_hints(options: ReplayOptions) -> None:
    RecordingLRU.seen.clear()
    RecordingLRU.prompts.clear()
    RecordingLRU.finished.clear()
    trace = make_trace(
        request("a", [0, 1], last=7, t=2.5, out=3), request("b", [0, 1, 2, 3], t=4.0, out=9)
    )
    replay(trace, 8, PolicySpec(f"{__name__}:RecordingLRU"), options)
    assert RecordingLRU.prompts == [519, 519, 2048, 2048]
    assert sorted(RecordingLRU.finished) == [("a", 3), ("b", 9)]
    first, last = RecordingLRU.seen[0], RecordingLRU.seen[-1]
    assert first[:6] == ("a", 2.5, "s", 2, False, 0)
    assert RecordingLRU.seen[1][4] is True  # key 1 is a's partial tail
    assert first[6] == [512, 519, None, None]
    assert last[:6] == ("b", 4.0, "s", 4, False, 2)
    assert last[6] == [512, 1024, 1536, 2048]


def test_policy_params_and_bad_options() -> None:
    trace = make_trace(request("a", [0]))
    with pytest.raises(ValueError, match="Bad cache_policy_params"):
        replay(trace, 2, PolicySpec.of("lru", params={"nope": 1}))
    with pytest.raises(ValueError, match="unknown replay mode"):
        ReplayOptions(mode="tokens")
    with pytest.raises(ValueError, match="needs prefix mode"):
        ReplayOptions(mode="blocks", overlap=True)
    assert PolicySpec.of("x", params={"b": 2, "a": 1}).label == "x(a=1, b=2)"


def test_hit_length_summary() -> None:
    summary = summarize_hit_lengths([0, 0, 1, 3, 4, 9])
    assert summary.requests_with_hit == 4 and summary.max == 9 and summary.p50 == 1
    assert summary.histogram == {"0": 2, "1": 1, "2-3": 1, "4-7": 1, "8-15": 1}
    assert summarize_hit_lengths([]).mean == 0.0
