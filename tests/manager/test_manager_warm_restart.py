"""Warm restarts: a manager saved half-way and restored resumes with the same decisions."""

from __future__ import annotations

import json

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, int_key
from kvoffload.policies import CachePolicyFactory
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import make_context
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

#: Every built-in: the state is generic, so each one's order, counts and ghosts survive.
POLICIES = CachePolicyFactory.registered_names()


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate_workload(WorkloadConfig(requests=300, seed=3))


def _run(m: CPUOffloadingManager, trace: Trace, start: int, stop: int) -> tuple[int, int]:
    """Prefix-mode requests ``start..stop`` (lookups, loads, stores); (hits, evictions)."""
    hits = evictions = 0
    for request in trace.requests[start:stop]:
        keys: list[OffloadKey] = [int_key(i) for i in request.block_ids]
        keys = list(dict.fromkeys(keys))
        ctx = make_context(request, keys, trace.block_tokens)
        m.on_new_request(ctx)
        p = 0
        while p < len(keys) and m.lookup(keys[p], ctx) is LookupResult.HIT:
            p += 1
        ctx.prefix_hit_blocks = p
        hits += p
        if p:
            m.prepare_load(keys[:p], ctx)
        out = m.prepare_store(keys[p:], ctx) if p < len(keys) else None
        if out is not None:
            evictions += len(out.evicted_keys)
            m.complete_store(out.keys_to_store, ctx)
        if p:
            m.complete_load(keys[:p], ctx)
        ctx.output_tokens = request.output_tokens
        m.on_request_finished(ctx)
    return hits, evictions


@pytest.mark.parametrize("policy", POLICIES)
def test_save_and_restore_half_way_gives_the_same_hits(policy: str, trace: Trace) -> None:
    capacity = max(8, trace.num_unique_blocks // 20)
    half = len(trace.requests) // 2
    whole = CPUOffloadingManager(capacity, cache_policy=policy)
    first = _run(whole, trace, 0, half)
    second = _run(whole, trace, half, len(trace.requests))

    before = CPUOffloadingManager(capacity, cache_policy=policy)
    assert _run(before, trace, 0, half) == first
    data = before.export_state()
    after = CPUOffloadingManager.from_state(data)
    assert type(after.policy) is type(before.policy) and after.num_blocks == capacity
    stats = after.get_stats()
    assert stats.stored_blocks == before.get_stats().stored_blocks > 0
    assert stats.evictable_blocks == stats.stored_blocks and stats.hits == 0
    assert _run(after, trace, half, len(trace.requests)) == second
    assert second[1] > 0, "the second half must evict, or it tests nothing about order"


def test_restore_settles_jobs_in_flight_and_keeps_slots() -> None:
    m = CPUOffloadingManager(6, cache_policy="arc")
    a, b = ReqContext(req_id="a"), ReqContext(req_id="b")
    out = m.prepare_store([int_key(1), int_key(2), int_key(3)], a)
    assert out is not None
    m.complete_store(out.keys_to_store, a)
    m.prepare_load([int_key(2)], b)  # pinned at the save
    pending = m.prepare_store([int_key(9)], b)  # being written at the save
    assert pending is not None
    slots = {k: m.policy.get(k).block_id for k in (int_key(1), int_key(2), int_key(3))}  # type: ignore[union-attr]
    restored = CPUOffloadingManager.from_state(m.export_state(), enable_events=True)
    stats = restored.get_stats()
    assert (stats.stored_blocks, stats.pinned_blocks, stats.pending_blocks) == (3, 0, 0)
    assert restored.lookup(int_key(9)) is LookupResult.MISS
    for key, slot in slots.items():
        status = restored.policy.get(key)
        assert status is not None and status.block_id == slot and status.ref_cnt == 0
    c = ReqContext(req_id="c")
    fresh = restored.prepare_store([int_key(20 + i) for i in range(3)], c)
    assert fresh is not None and not set(fresh.store_spec.block_ids) & set(slots.values())
    assert restored.prepare_store([int_key(30)], ReqContext(req_id="d")) is not None


def test_bad_states_and_options_are_rejected() -> None:
    m = CPUOffloadingManager(4, cache_policy="lru")
    data = m.export_state()
    with pytest.raises(TypeError, match="num_blocks"):
        CPUOffloadingManager.from_state(data, num_blocks=4)
    with pytest.raises(ValueError, match="not JSON"):
        CPUOffloadingManager.from_state(b"{oops")
    with pytest.raises(ValueError, match="format"):
        CPUOffloadingManager.from_state(b'{"format": "other"}')
    doc = json.loads(data)
    doc["num_blocks"] = 5
    with pytest.raises(ValueError, match="holds 4 blocks"):
        CPUOffloadingManager.from_state(json.dumps(doc))
    m.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        m.export_state()
