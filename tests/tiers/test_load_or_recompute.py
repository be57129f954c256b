"""The manager's load-or-recompute decision: a slow tier is not waited for, a fast one is."""

from __future__ import annotations

import time

import pytest
from tier_helpers import FakeClock, key

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.testing.slow_tier import SlowMemoryTier
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.costs import CPU_TIER, tier_read_cost
from kvoffload.tiers.manager import SecondaryTier, TieringManager

SLOT = 64 * 1024
BLOCK_TOKENS = 16
PREFILL_TOKENS_PER_S = 2000.0  # 8 ms per block: a 20 ms read costs more than it saves
PENDING = LookupResult.HIT_PENDING
MISS = LookupResult.MISS


def build(delay_s: float, **kwargs):
    clock = FakeClock()
    memory = BytearraySlotMemory(SLOT, 8)
    cpu = CPUOffloadingManager(8)
    tier = SlowMemoryTier(memory, 64 * SLOT, name="slow", clock=clock)
    for i in range(60):  # seeded at full speed, then slowed
        tier.submit_put([key(i)], [0])
    assert all(r.all_ok for r in tier.poll())
    tier.delay_s = delay_s
    spec = SecondaryTier(tier, write_policy="none")
    kwargs.setdefault("block_tokens", BLOCK_TOKENS)
    kwargs.setdefault("prefill_tokens_per_s", PREFILL_TOKENS_PER_S)
    manager = TieringManager(cpu, memory, [spec], clock=clock, **kwargs)
    return manager, tier, clock


def request(manager, clock, keys, tier, n=0):
    """One request over ``keys`` (a whole prompt of them plus one token); returns results."""
    ctx = ReqContext(req_id=f"r{n}", prompt_tokens=len(keys) * BLOCK_TOKENS + 1)
    results = manager.lookup_prefix(keys, ctx)
    clock.now += tier.latency_s  # the tier's read takes its time
    manager.step()
    manager.on_request_finished(ctx)
    manager.reset_cache()  # the next request finds its blocks in the tier only
    manager.step()
    return results


def learn(manager, clock, tier, jobs):
    """Real reads of single blocks with the decision off, so the tier's estimate is measured."""
    decide, manager.costs.decide = manager.costs.decide, False
    for n in range(jobs):
        request(manager, clock, [key(40 + n % 20)], tier, n)
    manager.costs.decide = decide


def test_a_slow_tier_is_not_read_and_its_blocks_are_counted_recomputed_by_choice() -> None:
    manager, tier, clock = build(delay_s=0.5)
    learn(manager, clock, tier, 12)
    stats = manager.get_stats().tiers["slow"]
    assert stats["est_read_fixed_s"] > 0.01  # measured from its own jobs (prior: 1 ms)
    promotions_before = stats["promotions"]
    results = request(manager, clock, [key(i) for i in range(4)], tier, 99)
    assert results == [MISS] * 4
    stats = manager.get_stats().tiers["slow"]
    assert stats["promotions"] == promotions_before  # nothing was read from it
    assert stats["blocks_recomputed_by_choice"] >= 4


def test_a_fast_tier_serves_every_hit_block() -> None:
    manager, tier, clock = build(delay_s=0.0005)
    learn(manager, clock, tier, 12)
    results = request(manager, clock, [key(i) for i in range(4)], tier, 99)
    assert results == [PENDING] * 4
    stats = manager.get_stats().tiers["slow"]
    assert stats["blocks_recomputed_by_choice"] == 0
    assert stats["promotions"] == 12 + 4


def test_decide_false_promotes_from_a_slow_tier() -> None:
    manager, tier, clock = build(delay_s=0.5, decide=False)
    learn(manager, clock, tier, 12)
    assert request(manager, clock, [key(i) for i in range(4)], tier, 99) == [PENDING] * 4
    assert manager.get_stats().tiers["slow"]["blocks_recomputed_by_choice"] == 0
    assert manager.get_stats().tiering["decide"] == 0


def test_the_decision_is_off_by_default_until_the_engine_gives_its_prefill_speed() -> None:
    manager, tier, clock = build(delay_s=0.5, prefill_tokens_per_s=None)
    learn(manager, clock, tier, 12)
    assert manager.get_stats().tiering["decide"] == 0
    assert request(manager, clock, [key(i) for i in range(4)], tier, 98) == [PENDING] * 4
    for _ in range(3):
        manager.observe_prefill(256, 256 / PREFILL_TOKENS_PER_S)
    assert manager.get_stats().tiering["decide"] == 1
    assert request(manager, clock, [key(i) for i in range(4)], tier, 99) == [MISS] * 4


def test_a_plan_without_a_prompt_length_is_not_made() -> None:
    manager, tier, clock = build(delay_s=0.5)
    learn(manager, clock, tier, 12)
    ctx = ReqContext(req_id="x")  # no prompt_tokens: nothing to weigh the reads against
    assert manager.lookup_prefix([key(0)], ctx) == [PENDING]
    assert manager.request_plan(ctx) is None


def test_the_benefit_adds_up() -> None:
    manager, tier, clock = build(delay_s=0.002)
    learn(manager, clock, tier, 10)
    stats = manager.get_stats().tiers["slow"]
    assert stats["tokens_served"] == 10 * BLOCK_TOKENS == stats["promotions"] * BLOCK_TOKENS
    per_token = 1.0 / manager.get_stats().tiering["prefill_tokens_per_s"]
    assert stats["prefill_seconds_saved"] == pytest.approx(stats["tokens_served"] * per_token)
    assert stats["load_seconds"] == pytest.approx(stats["read_seconds"])
    assert stats["net_seconds_saved"] == pytest.approx(
        stats["prefill_seconds_saved"] - stats["load_seconds"]
    )
    assert stats["load_seconds"] == pytest.approx(10 * 0.002)


def test_a_measured_cpu_copy_slower_than_prefill_is_not_loaded_either() -> None:
    manager, _tier, _clock = build(delay_s=0.0005)
    ctx = ReqContext(req_id="a", prompt_tokens=2 * BLOCK_TOKENS + 1)
    assert manager.lookup_prefix([key(0), key(1)], ctx) == [PENDING, PENDING]
    manager.step()
    for _ in range(12):  # the engine reports CPU->device copies far slower than prefill
        manager.observe_cpu_load(2, 2 * SLOT, 1.0)
    ctx = ReqContext(req_id="b", prompt_tokens=2 * BLOCK_TOKENS + 1)
    assert manager.lookup_prefix([key(0), key(1)], ctx) == [MISS, MISS]
    plan = manager.request_plan(ctx)
    assert plan is not None and dict(plan.recomputed_by_tier) == {CPU_TIER: 2}
    assert manager.get_stats().tiering["cpu_blocks_recomputed_by_choice"] == 2


def test_a_tier_judged_slow_is_read_again_now_and_then_so_a_recovery_is_measured() -> None:
    manager, tier, clock = build(delay_s=0.5)
    learn(manager, clock, tier, 12)
    tier.delay_s = 0.0005  # it recovers; only a read can tell
    before = manager.get_stats().tiers["slow"]
    served = []
    for n in range(2 * manager.costs.probe_every + 2):
        served.append(request(manager, clock, [key(i) for i in range(4)], tier, 100 + n)[0])
    stats = manager.get_stats().tiers["slow"]
    assert stats["probes"] == 2  # one read per probe_every skips
    # a probe reads in the background: its request recomputes and waits for no read
    assert served == [MISS] * len(served)
    assert stats["promotions"] == before["promotions"] + 2 * 4
    assert stats["est_read_fixed_s"] < before["est_read_fixed_s"]  # each fast read pulls it down


def test_a_read_abandoned_by_a_reset_still_measures_the_tier_but_serves_nothing() -> None:
    manager, tier, clock = build(delay_s=0.5)
    ctx = ReqContext(req_id="a", prompt_tokens=2 * BLOCK_TOKENS + 1)
    assert manager.lookup_prefix([key(0), key(1)], ctx) == [PENDING, PENDING]
    clock.now += tier.latency_s  # the read takes its time; the request gave up meanwhile
    manager.reset_cache()  # the reset drains it: a stale completion
    manager.step()
    stats = manager.get_stats().tiers["slow"]
    assert stats["est_read_observations"] == 1 and stats["tokens_served"] == 0
    prior = tier_read_cost().predict(2 * SLOT)
    assert manager.costs.tiers[0].read.predict(2 * SLOT) > 1.5 * prior  # the slow read counted


def test_the_slow_tiers_drain_waits_for_its_jobs_to_be_due() -> None:
    # On the real clock a slow medium's drain blocks until its reads are done (the memory
    # tier's completes them at once), so a manager waiting through drain sees its latency.
    memory = BytearraySlotMemory(SLOT, 2)
    tier = SlowMemoryTier(memory, 4 * SLOT, delay_s=0.0)
    tier.submit_put([key(0)], [0])
    assert tier.drain(1.0)
    tier.poll()
    tier.delay_s = 0.2
    began = time.monotonic()
    tier.submit_get([key(0)], [1])
    assert not tier.drain(0.05)  # not due yet
    assert tier.poll() == []
    assert tier.drain(5.0)
    assert 0.18 < time.monotonic() - began < 2.0
    (result,) = tier.poll()
    assert result.all_ok and result.seconds >= 0.18
    tier.close()
