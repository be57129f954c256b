"""The facade's lookup never waits on a tier past the plan's deadline plus its margin."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.keys import hash_token_blocks  # noqa: E402
from kvoffload.manager import LookupResult  # noqa: E402
from kvoffload.offloader import KVOffloader  # noqa: E402
from kvoffload.tiers.protocol import TieredManager  # noqa: E402

TOKENS = 4  # tokens per device block in make_caches
PER_SLOT = 2 * 2 * TOKENS * 2 * 4 * 2  # layers * (K, V) * tokens * heads * head_size * fp16
SLOW = "kvoffload.testing.slow_tier:SlowMemoryTier"


def _offloader(delay_s: float, **kw: object) -> KVOffloader:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=3)
    tiers = [{"type": SLOW, "capacity_bytes": 64 * PER_SLOT, "delay_s": delay_s}]
    return KVOffloader(caches, cpu_bytes=8 * PER_SLOT, tiers=tiers, tier_wait_s=5.0, **kw)


def _warm_tier(off: KVOffloader, hashes: list[bytes]) -> None:
    off.store(hashes, list(range(len(hashes))))
    off.flush()
    off.reset()  # the CPU forgets; the slow tier keeps them


def test_lookup_stops_waiting_at_the_plan_deadline_plus_margin() -> None:
    # 6 blocks of 4 tokens at 1,000 tokens/s: recomputing the prompt takes about 25 ms, so a
    # tier whose reads take 0.6 s is never waited for that long, even on its (fast) prior.
    off = _offloader(0.6, prefill_tokens_per_s=1000.0)
    hashes = hash_token_blocks(list(range(6 * TOKENS)), TOKENS)
    _warm_tier(off, hashes)
    ctx = off.begin_request("r")
    began = time.monotonic()
    hits = off.lookup(hashes, ctx=ctx, num_tokens=6 * TOKENS + 1)
    waited = time.monotonic() - began
    plan = off.manager.request_plan(ctx)  # type: ignore[attr-defined]
    assert plan is not None and plan.load_blocks == 6  # the prior says: load them all
    bound = plan.deadline_s + off.decision_margin(plan.deadline_s)
    assert bound < 0.05
    assert hits == 0  # the reads were not back by the deadline: the prompt is recomputed
    assert waited < 0.3  # far below the tier's 0.6 s and tier_wait_s (slack for a busy box)
    (tier,) = off.stats().manager.tiers.values()  # type: ignore[union-attr]
    assert tier["est_read_floor_s"] >= bound  # the overdue read taught the tier's estimate
    off.end_request(ctx)
    off.close()


def test_one_overdue_read_is_enough_the_next_request_does_not_wait() -> None:
    # Two prefixes on a tier whose reads take 0.6 s. The first request waits its deadline;
    # its read, still in flight, is a lower bound on the tier's cost at once, so the second
    # request (another prefix, before that read completes) recomputes without waiting.
    off = _offloader(0.6, prefill_tokens_per_s=1000.0)
    first = hash_token_blocks(list(range(6 * TOKENS)), TOKENS)
    second = hash_token_blocks(list(range(100, 100 + 6 * TOKENS)), TOKENS)
    _warm_tier(off, first)
    _warm_tier(off, second)
    ctx = off.begin_request("a")
    assert off.lookup(first, ctx=ctx, num_tokens=6 * TOKENS + 1) == 0
    off.end_request(ctx)
    ctx = off.begin_request("b")
    began = time.monotonic()
    assert off.lookup(second, ctx=ctx, num_tokens=6 * TOKENS + 1) == 0
    waited = time.monotonic() - began
    plan = off.manager.request_plan(ctx)  # type: ignore[attr-defined]
    assert plan is not None and plan.load_blocks == 0  # recomputed by choice, not by deadline
    assert waited < plan.recompute_s / 2
    off.end_request(ctx)
    off.reset()  # drains the first read: its completion restarts the estimate (>= the floor)
    (tier,) = off.stats().manager.tiers.values()  # type: ignore[union-attr]
    assert tier["est_read_observations"] == 1 and tier["est_read_floor_s"] == 0.0
    assert off.manager.costs.tiers[0].read.predict(6 * PER_SLOT) > plan.recompute_s  # type: ignore[attr-defined]
    off.close()


def test_without_the_decision_lookup_waits_for_the_tier() -> None:
    off = _offloader(0.2, decide=False, prefill_tokens_per_s=1000.0)
    hashes = hash_token_blocks(list(range(6 * TOKENS)), TOKENS)
    _warm_tier(off, hashes)
    assert off.lookup(hashes, num_tokens=6 * TOKENS + 1) == 6
    off.close()


def test_cpu_loads_feed_the_cpu_tiers_estimate_and_benefit() -> None:
    off = _offloader(0.0, prefill_tokens_per_s=1000.0)
    hashes = hash_token_blocks(list(range(4 * TOKENS)), TOKENS)
    off.store(hashes, [0, 1, 2, 3])
    off.flush()
    assert off.lookup(hashes, num_tokens=4 * TOKENS + 1) == 4
    assert off.load(hashes, [8, 9, 10, 11]) == 4
    tiering = off.stats().manager.tiering  # type: ignore[union-attr]
    assert tiering["cpu_tokens_served"] == 4 * TOKENS
    assert tiering["cpu_est_read_observations"] == 1
    assert tiering["decide"] == 1
    off.close()


def test_lookup_waits_for_its_own_reads_not_for_another_requests_slow_one() -> None:
    # The facade blocks in the manager's wait(timeout, ctx) for the request's own promotions:
    # another request's read of other blocks, still in flight for 1 s, does not hold it.
    off = _offloader(0.0, decide=False)
    mine = hash_token_blocks(list(range(2 * TOKENS)), TOKENS)
    theirs = hash_token_blocks(list(range(100, 100 + 2 * TOKENS)), TOKENS)
    _warm_tier(off, mine)
    _warm_tier(off, theirs)
    manager = off.manager
    (tier,) = manager.tiers  # type: ignore[attr-defined]
    tier.delay_s = 1.0  # their read, submitted now, takes 1 s
    other = off.begin_request("other")
    keys = off._chunk_keys(theirs, 0)
    assert manager.lookup_prefix(keys, other)[0] is LookupResult.HIT_PENDING  # type: ignore[attr-defined]
    tier.delay_s = 0.02  # ours takes 20 ms
    ctx = off.begin_request("mine")
    began = time.monotonic()
    assert off.lookup(mine, ctx=ctx) == 2
    assert time.monotonic() - began < 0.5
    assert manager.promotions_in_flight() == 2  # type: ignore[attr-defined]
    off.end_request(ctx)
    off.end_request(other)
    off.close()


def test_the_facade_drives_a_tiering_manager_through_its_protocol() -> None:
    off = _offloader(0.0)
    assert isinstance(off.manager, TieredManager)
    plain = KVOffloader(make_caches("kv_first", torch.float16, layers=2, blocks=8), 8 * PER_SLOT)
    assert not isinstance(plain.manager, TieredManager)
    hashes = hash_token_blocks(list(range(2 * TOKENS)), TOKENS)
    assert plain.store(hashes, [0, 1]) == 2 and plain.lookup(hashes) == 2
    plain.close()
    off.close()
