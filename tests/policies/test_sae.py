"""sae: conformance, parameters, session scoring and grouping, ghosts, decay, admission gate."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from replay_helpers import manager_decisions, one_at_a_time

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.policies import create_cache_policy
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.sae import SAEAdmissionGate, SAECachePolicy
from kvoffload.testing import check_policy_conformance, int_key

BLOCK_TOKENS = 16


def _id(key: bytes) -> int:
    return int.from_bytes(key[:8], "big")


def _keys(*ids: int) -> list[OffloadKey]:
    return [int_key(i) for i in ids]


def _ctx(req_id: str, session_id: str | None = None, prefix_hits: int = 0) -> ReqContext:
    return ReqContext(req_id=req_id, session_id=session_id, prefix_hit_blocks=prefix_hits)


def _request(policy: SAECachePolicy, ids: list[int], ctx: ReqContext) -> None:
    """One request as the manager drives it: touch its keys, store the missing ones, complete."""
    keys = _keys(*ids)
    policy.touch(keys, ctx)
    new = [k for k in keys if policy.get(k) is None]
    for key in new:
        policy.insert(key, BlockStatus(_id(key), -1), ctx)
    for key in reversed(new):
        status = policy.get(key)
        assert status is not None
        status.ref_cnt = 0
        policy.mark_evictable(key)
    policy.on_request_finished(ctx)


def _evict(policy: SAECachePolicy, n: int, protected: set[int] | None = None) -> list[int]:
    victims = policy.evict(n, set(_keys(*(protected or set()))))
    assert victims is not None
    return [_id(key) for key, _ in victims]


# ------------------------------------------------------------------ contract and parameters
def test_conformance_default_parameters() -> None:
    check_policy_conformance(SAECachePolicy)


def test_conformance_other_parameters() -> None:
    check_policy_conformance(
        SAECachePolicy,
        decay_interval=3,
        decay_factor=0.5,
        ghost_hit_weight=2.0,
        ghost_miss_weight=0.5,
        ghost_norm=1.0,
        touch_weight=1.0,
        depth_bonus=4.0,
        depth_half_life=1.0,
        ghost_prune_threshold=0.2,
        ghost_capacity=3,
    )


def test_registered_by_name() -> None:
    policy = create_cache_policy("sae", 4, params={"decay_interval": 7})
    assert isinstance(policy, SAECachePolicy)
    assert policy.decay_interval == 7


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("decay_interval", 0),
        ("decay_interval", 2.5),
        ("decay_interval", True),
        ("decay_factor", 0.0),
        ("decay_factor", 1.5),
        ("ghost_hit_weight", -1.0),
        ("ghost_miss_weight", math.nan),
        ("ghost_norm", 0.0),
        ("touch_weight", math.inf),
        ("depth_bonus", "big"),
        ("depth_half_life", -8.0),
        ("ghost_prune_threshold", -0.1),
        ("ghost_capacity", -1),
        ("ghost_capacity", 1.5),
    ],
)
def test_bad_parameters_are_type_or_value_errors(name: str, value: object) -> None:
    ints = ("decay_interval", "ghost_capacity")
    wrong_type = isinstance(value, (str, bool)) or (name in ints and isinstance(value, float))
    with pytest.raises(TypeError if wrong_type else ValueError, match=name):
        SAECachePolicy(8, **{name: value})  # type: ignore[arg-type]


# ------------------------------------------------------------------ sessions
def test_the_worst_session_goes_first_tail_first() -> None:
    policy = SAECachePolicy(16)
    _request(policy, [1, 2, 3], _ctx("a"))
    _request(policy, [10, 11, 12], _ctx("b"))
    assert _evict(policy, 2) == [3, 2]  # a is older: same hits, same depth
    assert _evict(policy, 2) == [1, 12]
    assert policy.stats()["sessions"] == 1


def test_reuse_outweighs_recency() -> None:
    policy = SAECachePolicy(16)
    _request(policy, [1, 2], _ctx("a"))
    _request(policy, [1, 2], _ctx("a-again"))  # a hit on session a: hits + 1
    _request(policy, [10, 11], _ctx("b"))  # newer, but never reused
    assert _evict(policy, 2) == [11, 10]


def test_a_deep_cached_prefix_earns_a_smaller_bonus() -> None:
    policy = SAECachePolicy(16, touch_weight=0.0)
    _request(policy, [1, 2], _ctx("shallow"))
    _request(policy, [10, 11], _ctx("deep", prefix_hits=40))
    assert policy.stats()["sessions"] == 2
    assert _evict(policy, 2) == [11, 10]  # newer, but far less bonus


def test_score_formula() -> None:
    policy = SAECachePolicy(16, touch_weight=100.0, depth_bonus=800.0, depth_half_life=4.0)
    _request(policy, [1], _ctx("a", prefix_hits=4))
    _request(policy, [1], _ctx("a2"))
    info = policy.session_info(int_key(1))
    assert info is not None
    # Last touch: the second request's touch (t=2). Hits: that hit, plus the block's ghost
    # (one miss at position 0: 1.0) / ghost_norm when the new session stored it. Depth 4
    # halves the bonus.
    assert info["hits"] == pytest.approx(1 + 1 / 12)
    assert info["score"] == pytest.approx(2 + (1 + 1 / 12) * 100 + 800 / 2)


def test_a_request_continuing_a_cached_prefix_joins_its_session() -> None:
    policy = SAECachePolicy(16)
    _request(policy, [1, 2], _ctx("turn-1"))
    _request(policy, [1, 2, 3, 4], _ctx("turn-2"))
    _request(policy, [20], _ctx("other"))
    assert policy.stats()["sessions"] == 2
    # The conversation has more hits than "other"; it would go whole, tail first.
    assert _evict(policy, 1) == [20]
    assert _evict(policy, 4) == [4, 3, 2, 1]


def test_named_sessions_group_requests_without_shared_blocks() -> None:
    policy = SAECachePolicy(16)
    _request(policy, [1], _ctx("r1", session_id="chat"))
    _request(policy, [2], _ctx("r2", session_id="chat"))
    _request(policy, [3], _ctx("r3", session_id="other"))
    assert policy.stats()["sessions"] == 2
    assert _evict(policy, 2) == [2, 1]


def test_a_request_keeps_its_session_across_stores_and_drops_it_when_finished() -> None:
    policy = SAECachePolicy(16)
    ctx = _ctx("long")
    for block in (1, 2, 3):  # stored one step at a time, like decoding
        policy.touch(_keys(block), ctx)
        policy.insert(int_key(block), BlockStatus(block, 0), ctx)
    assert policy.stats()["sessions"] == 1
    policy.on_request_finished(ctx)
    policy.touch(_keys(4), ctx)
    policy.insert(int_key(4), BlockStatus(4, 0), ctx)
    assert policy.stats()["sessions"] == 2


def test_without_context_a_touch_closes_the_implicit_session() -> None:
    policy = SAECachePolicy(16)
    policy.touch(_keys(1, 2))
    for block in (1, 2):
        policy.insert(int_key(block), BlockStatus(block, 0))
    policy.touch(_keys(3))
    policy.insert(int_key(3), BlockStatus(3, 0))
    assert policy.stats()["sessions"] == 2


def test_pinned_blocks_are_skipped_and_the_next_session_serves() -> None:
    policy = SAECachePolicy(16)
    _request(policy, [1, 2], _ctx("a"))
    _request(policy, [10, 11], _ctx("b"))
    for key in _keys(1, 2):
        status = policy.get(key)
        assert status is not None
        status.ref_cnt = 1
        policy.mark_non_evictable(key)
    assert _evict(policy, 1, protected={11}) == [10]
    assert policy.evict(2, set()) is None
    assert _evict(policy, 1) == [11]


# ------------------------------------------------------------------ ghosts and decay
def test_ghost_scores_weigh_position_and_hits() -> None:
    policy = SAECachePolicy(16, ghost_hit_weight=12.0, ghost_miss_weight=1.0)
    policy.touch(_keys(7, 8, 9), _ctx("r"))  # misses at positions 0, 1, 2
    assert policy.ghost_score(int_key(7)) == pytest.approx(1.0)
    assert policy.ghost_score(int_key(9)) == pytest.approx(1 / math.log2(4))
    policy.insert(int_key(7), BlockStatus(0, 0))
    policy.touch(_keys(7), _ctx("hit"))  # a ready hit at position 0
    assert policy.ghost_score(int_key(7)) == pytest.approx(1.0 + 12.0)


def test_an_evicted_blocks_ghost_boosts_the_session_that_stores_it_again() -> None:
    policy = SAECachePolicy(16, touch_weight=1500.0, ghost_norm=12.0)
    _request(policy, [1], _ctx("a"))
    for i in range(3):
        _request(policy, [1], _ctx(f"hit-{i}"))
    ghost = policy.ghost_score(int_key(1))
    assert _evict(policy, 1) == [1]
    assert policy.ghost_score(int_key(1)) == pytest.approx(ghost)  # outlives the block
    _request(policy, [1], _ctx("again"))  # one more miss touch, then a fresh session
    _request(policy, [2], _ctx("plain"))
    info = policy.session_info(int_key(1))
    assert info is not None
    assert info["hits"] == pytest.approx(policy.ghost_score(int_key(1)) / 12.0)
    assert _evict(policy, 1) == [2]  # the ghost bonus outweighs one tick of recency


def test_decay_scales_hits_and_ghosts() -> None:
    policy = SAECachePolicy(16, decay_interval=4, decay_factor=0.5)
    _request(policy, [1], _ctx("a"))
    _request(policy, [1], _ctx("b"))
    _request(policy, [1], _ctx("c"))
    before = policy.session_info(int_key(1))
    assert before is not None
    ghost = policy.ghost_score(int_key(1))
    policy.touch(_keys(99), _ctx("tick"))  # the 4th touch: decay
    after = policy.session_info(int_key(1))
    assert after is not None
    assert after["hits"] == pytest.approx(before["hits"] * 0.5)
    assert policy.ghost_score(int_key(1)) == pytest.approx(ghost * 0.5)


def test_decay_reorders_sessions() -> None:
    policy = SAECachePolicy(16, decay_interval=10, decay_factor=0.001, depth_bonus=0.0)
    for req_id in ("old", "old-hit", "old-hit-2"):  # t=1..3: two hits
        _request(policy, [1], _ctx(req_id))
    for req_id in ("new", "new-hit"):  # t=4..5: one hit, but more recent
        _request(policy, [2], _ctx(req_id))

    def score(block: int) -> float:
        info = policy.session_info(int_key(block))
        assert info is not None
        return info["score"]

    assert score(2) < score(1)  # hits dominate
    for i in range(5):
        policy.touch(_keys(100 + i), _ctx(f"t{i}"))  # the 10th touch decays
    assert score(1) < score(2)  # hits barely count now: recency decides
    assert _evict(policy, 1) == [1]


def test_ghosts_below_the_prune_threshold_read_as_zero_and_the_table_is_bounded() -> None:
    policy = SAECachePolicy(4, decay_interval=1, decay_factor=0.5, ghost_prune_threshold=0.3)
    policy.touch(_keys(1), _ctx("a"))
    assert policy.ghost_score(int_key(1)) == pytest.approx(0.5)  # one decay after the touch
    policy.touch(_keys(2), _ctx("b"))
    assert policy.ghost_score(int_key(1)) == 0.0
    for block in range(100):
        policy.touch(_keys(1000 + block), _ctx(f"s{block}"))
    assert policy.stats()["ghosts"] <= 4


def test_a_failed_store_leaves_no_ghost_and_no_session() -> None:
    policy = SAECachePolicy(4)
    ctx = _ctx("r")
    policy.touch(_keys(1), ctx)
    policy.insert(int_key(1), BlockStatus(0, -1), ctx)
    policy.remove(int_key(1))
    assert policy.ghost_score(int_key(1)) == 0.0
    assert policy.stats()["sessions"] == 0


# ------------------------------------------------------------------ through the manager
def _run(manager: CPUOffloadingManager, ids: list[int], req_id: str) -> bool:
    """Look up the prefix, load it, store the rest; return whether the store was admitted."""
    keys = _keys(*ids)
    ctx = ReqContext(req_id=req_id)
    ctx.set_key_positions([bytes(k) for k in keys], BLOCK_TOKENS)
    hits = 0
    while hits < len(keys) and manager.lookup(keys[hits], ctx) is LookupResult.HIT:
        hits += 1
    ctx.prefix_hit_blocks = hits
    if hits:
        manager.prepare_load(keys[:hits], ctx)
    out = manager.prepare_store(keys[hits:], ctx) if hits < len(keys) else None
    if out is not None and out.keys_to_store:
        manager.complete_store(out.keys_to_store, ctx)
    if hits:
        manager.complete_load(keys[:hits], ctx)
    manager.on_request_finished(ctx)
    return out is not None and bool(out.keys_to_store)


def test_shared_prefix_outlives_the_suffixes_of_weaker_sessions() -> None:
    manager = CPUOffloadingManager(7, cache_policy="sae")
    _run(manager, [1, 2, 3], "turn-1")
    _run(manager, [1, 2, 3, 4], "turn-2")  # continues the conversation
    _run(manager, [50, 51], "one-off")
    _run(manager, [60, 61], "another")  # needs 1 slot: from the worst session's tail
    policy = manager.policy
    assert all(policy.get(k) is not None for k in _keys(1, 2, 3, 4))
    assert policy.get(int_key(51)) is None and policy.get(int_key(50)) is not None


def test_evict_never_refuses_but_the_optional_gate_does() -> None:
    policy = SAECachePolicy(4)
    gated = CPUOffloadingManager(4, cache_policy=policy, admission=SAEAdmissionGate(policy))
    plain = CPUOffloadingManager(4, cache_policy="sae")
    for manager in (gated, plain):
        _run(manager, [1, 2], "a")
        _run(manager, [1, 2], "a-hit")
        _run(manager, [1, 2], "a-hit-2")
        _run(manager, [3, 4], "b")
        _run(manager, [3, 4], "b-hit")
        _run(manager, [3, 4], "b-hit-2")
    # A cold request cannot beat the reused sessions' scores: the gate refuses it.
    assert _run(plain, [10, 11], "cold") is True
    assert _run(gated, [10, 11], "cold") is False
    assert gated.get_stats().admission_rejects == 2
    assert gated.get_stats().failed_allocations == 0
    # Continuing a live session is always admitted.
    assert _run(gated, [1, 2, 5], "a-continues") is True


def test_the_gate_admits_when_no_eviction_is_needed() -> None:
    policy = SAECachePolicy(8)
    gate = SAEAdmissionGate(policy)
    assert gate.admit(_keys(1, 2, 3), ReqContext(req_id="r")) == _keys(1, 2, 3)
    with pytest.raises(ValueError, match="SAECachePolicy"):
        SAEAdmissionGate(object())  # type: ignore[arg-type]


# ------------------------------------------------------------------ selection vs. a sorted model
def _expected_victims(
    policy: SAECachePolicy, inserted: dict[int, int], ready: set[int], n: int, protected: set[int]
) -> list[int] | None:
    """Sessions sorted by (score, id), each one's evictable blocks newest insert first."""
    by_session: dict[int, tuple[float, list[int]]] = {}
    for block in ready:
        info = policy.session_info(int_key(block))
        assert info is not None
        sid = int(info["session"])
        by_session.setdefault(sid, (info["score"], []))[1].append(block)
    order: list[int] = []
    for sid in sorted(by_session, key=lambda s: (by_session[s][0], s)):
        blocks = sorted(by_session[sid][1], key=lambda b: -inserted[b])
        order.extend(b for b in blocks if b not in protected)
    return order[:n] if len(order) >= n else None


def _random_sae_history(seed: int, steps: int = 250) -> int:
    rng = random.Random(seed)
    capacity = rng.randint(2, 12)
    policy = SAECachePolicy(capacity, decay_interval=rng.randint(2, 30), decay_factor=0.7)
    statuses: dict[int, BlockStatus] = {}
    inserted: dict[int, int] = {}  # block -> insert sequence number
    sequence = 0
    next_id = 0
    compared = 0

    def evict_and_compare(n: int, protected: set[int]) -> bool:
        nonlocal compared
        ready = {b for b, s in statuses.items() if s.ref_cnt == 0}
        expected = _expected_victims(policy, inserted, ready, n, protected)
        victims = policy.evict(n, set(_keys(*protected)))
        got = None if victims is None else [_id(k) for k, _ in victims]
        assert got == expected, f"seed {seed}"
        compared += 1
        for block in got or []:
            del statuses[block], inserted[block]
        return got is not None

    for step in range(steps):
        roll = rng.random()
        stored = list(statuses)
        if roll < 0.35:
            reuse = rng.sample(stored, min(len(stored), rng.randint(0, 2)))
            new = list(range(next_id, next_id + rng.randint(1, 3)))
            next_id += len(new)
            ctx = ReqContext(
                req_id=f"r{step}",
                session_id=rng.choice([None, None, "s1", "s2"]),
                prefix_hit_blocks=len(reuse),
            )
            policy.touch(_keys(*reuse, *new), ctx)
            need = len(statuses) + len(new) - capacity
            if need > 0 and not evict_and_compare(need, set(new) | set(reuse)):
                continue
            for block in new:
                statuses[block] = BlockStatus(block, -1)
                inserted[block] = sequence
                sequence += 1
                policy.insert(int_key(block), statuses[block], ctx)
        elif roll < 0.55 and stored:
            block = rng.choice(stored)
            status = statuses[block]
            if status.ref_cnt == -1 and rng.random() < 0.1:
                policy.remove(int_key(block))
                del statuses[block], inserted[block]
            elif status.ref_cnt in (-1, 1):
                status.ref_cnt = 0
                policy.mark_evictable(int_key(block))
            elif status.ref_cnt == 0:
                status.ref_cnt = 1
                policy.mark_non_evictable(int_key(block))
        elif roll < 0.8 and stored:
            blocks = rng.sample(stored, rng.randint(1, min(3, len(stored))))
            policy.touch(_keys(*blocks), ReqContext(req_id=f"hit{step}"))
        elif stored:
            evict_and_compare(rng.randint(1, 3), {b for b in stored if rng.random() < 0.3})
    return compared


def test_eviction_matches_a_sorted_selection() -> None:
    assert sum(_random_sae_history(seed) for seed in range(40)) > 500


# ------------------------------------------------------------------ batched calls
@pytest.mark.parametrize("capacity", [6, 40])
@pytest.mark.parametrize("params", [{}, {"decay_interval": 7, "ghost_capacity": 10}])
def test_batched_calls_decide_like_single_calls(capacity: int, params: dict[str, Any]) -> None:
    batched = manager_decisions(SAECachePolicy(capacity, **params), capacity)
    assert batched == manager_decisions(one_at_a_time(SAECachePolicy)(capacity, **params), capacity)
