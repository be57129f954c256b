"""kvaware: contract conformance and that it learns from the signals it is given."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from replay_helpers import manager_decisions, one_at_a_time

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.kvaware import KVAwareCachePolicy
from kvoffload.testing import check_policy_conformance, drive_single_blocks

_ids = itertools.count()


def fresh_keys(n: int) -> list[OffloadKey]:
    return [make_offload_key(next(_ids).to_bytes(8, "big"), 0) for _ in range(n)]


def run_request(
    m: CPUOffloadingManager, keys: list[OffloadKey], t: float, output: int, tail: bool = False
) -> int:
    """The engine's call sequence for one request; returns its prefix hit length."""
    ctx = ReqContext(req_id=str(t), timestamp=t, partial_tail_key=keys[-1] if tail else None)
    m.on_new_request(ctx)
    hits = 0
    for key in keys:
        if m.lookup(key, ctx) is not LookupResult.HIT:
            break
        hits += 1
    ctx.prefix_hit_blocks = hits
    if hits:
        m.prepare_load(keys[:hits], ctx)
    out = m.prepare_store(keys[hits:], ctx)
    if out is not None and out.keys_to_store:
        m.complete_store(out.keys_to_store, ctx)
    if hits:
        m.complete_load(keys[:hits], ctx)
    ctx.output_tokens = output
    m.on_request_finished(ctx)
    return hits


def test_conformance_default_and_tuned() -> None:
    check_policy_conformance(KVAwareCachePolicy)
    check_policy_conformance(KVAwareCachePolicy, ghost_factor=0.0, horizon_factor=3.0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"short_output_tokens": -1}, "short_output_tokens"),
        ({"short_output_tokens": 64, "long_output_tokens": 8}, "long_output_tokens"),
        ({"horizon_factor": 0}, "horizon_factor"),
        ({"ghost_factor": -1.0}, "ghost_factor"),
        ({"prior_reuse": 1.5}, "prior_reuse"),
    ],
)
def test_bad_parameters(params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KVAwareCachePolicy(8, **params)  # type: ignore[arg-type]


def _train(m: CPUOffloadingManager, rounds: int) -> float:
    """Short-output conversations come back a few requests later; long-output ones never do."""
    t = 0.0
    for _ in range(rounds):
        returning = fresh_keys(3)
        t += 1
        run_request(m, returning, t, output=5)
        for _ in range(2):
            t += 1
            run_request(m, fresh_keys(3), t, output=500)
        t += 1
        run_request(m, returning, t, output=5)
    return t


def test_learns_that_short_output_sessions_return() -> None:
    capacity = 12
    kv = CPUOffloadingManager(capacity, cache_policy="kvaware")
    lru = CPUOffloadingManager(capacity, cache_policy="lru")
    for m in (kv, lru):
        _train(m, 200)
    stats = kv.get_stats().policy
    assert stats["p_used0_short"] > 3 * stats["p_used0_long"]
    # Now conversations return after 4 one-off requests: too far for LRU at this capacity.
    hits = {}
    for name, m in (("kvaware", kv), ("lru", lru)):
        t = 10_000.0
        total = 0
        for _ in range(50):
            returning = fresh_keys(3)
            t += 1
            run_request(m, returning, t, output=5)
            for _ in range(4):
                t += 1
                run_request(m, fresh_keys(3), t, output=500)
            t += 1
            total += run_request(m, returning, t, output=5)
        hits[name] = total
    assert hits["lru"] == 0
    assert hits["kvaware"] >= 100  # most of the 150 returning blocks hit


def test_partial_tails_are_learned_to_be_worthless() -> None:
    m = CPUOffloadingManager(10, cache_policy="kvaware")
    t = 0.0
    for _ in range(300):
        keys = fresh_keys(2)
        t += 1
        run_request(m, keys, t, output=40, tail=True)
        t += 1
        run_request(m, keys[:1], t, output=40)  # the head comes back, never the tail
    stats = m.get_stats().policy
    assert stats["p_partial_tail"] < 0.1
    assert stats["p_used0_medium"] > 0.5


def test_ghost_hit_counts_as_a_reuse_of_the_evicted_class() -> None:
    policy = KVAwareCachePolicy(1, ghost_factor=2.0)
    before = policy.stats()["p_used0_unknown"]
    drive_single_blocks(policy, [1, 2, 1])  # 1 is evicted by 2, then comes back
    assert policy.stats()["p_used0_unknown"] > before
    no_ghosts = KVAwareCachePolicy(1, ghost_factor=0.0)
    drive_single_blocks(no_ghosts, [1, 2, 1])
    assert no_ghosts.stats()["p_used0_unknown"] < before  # only entries, no reuse seen


def test_without_hints_it_still_prefers_reused_blocks() -> None:
    policy = KVAwareCachePolicy(3)
    keys = fresh_keys(4)
    for slot, key in enumerate(keys[:3]):
        status = BlockStatus(slot, -1)
        policy.insert(key, status)
        status.ref_cnt = 0
        policy.mark_evictable(key)
    for _ in range(3):  # many reuses of keys[0]: its class's odds rise above the new blocks'
        policy.touch([keys[0]])
    victims = policy.evict(2, {keys[3]})
    assert victims is not None
    assert keys[0] not in [k for k, _ in victims]


# ------------------------------------------------------------------ batched calls
@pytest.mark.parametrize("capacity", [6, 40])
@pytest.mark.parametrize("params", [{}, {"decay_window": 7, "ghost_factor": 0.5}])
def test_batched_calls_decide_like_single_calls(capacity: int, params: dict[str, Any]) -> None:
    batched = manager_decisions(KVAwareCachePolicy(capacity, **params), capacity)
    assert batched == manager_decisions(
        one_at_a_time(KVAwareCachePolicy)(capacity, **params), capacity
    )
