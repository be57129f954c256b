"""TieringManager: write policies, promotion, prefix trimming, breaker, in-flight bound, reset."""

from __future__ import annotations

import pytest
from tier_helpers import SLOT, FakeClock, build, key, pattern, read, seed, store

from kvoffload.admission import StoreAfterNOffers
from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.breaker import BreakerState
from kvoffload.tiers.manager import SecondaryTier, TieringManager, breaker_state

HIT, MISS = LookupResult.HIT, LookupResult.MISS
PENDING, RETRY = LookupResult.HIT_PENDING, LookupResult.RETRY


def evict_all(manager: TieringManager, memory: BytearraySlotMemory, start: int = 1000) -> None:
    """Fill the CPU tier with other blocks, so every earlier block is evicted from it."""
    ctx = ReqContext(req_id="filler")
    for i in range(manager.cpu.num_blocks):
        store(manager, memory, [key(start + i)], ctx)
        manager.step()


# ----------------------------------------------------------------- write policies
def test_write_through_writes_after_the_cpu_store_and_pins_the_source_slot() -> None:
    manager, memory, (tier,) = build(cpu_blocks=2, tier_kwargs=[{"latency_polls": 2}])
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1)], ctx)
    assert manager.has_pending_work()
    assert manager.get_stats().pinned_blocks == 1  # the put reads the slot: pinned
    # The CPU cannot evict the block being written: a 2-block store does not fit.
    assert manager.prepare_store([key(2), key(3)], ReqContext(req_id="b")) is None
    for _ in range(3):
        manager.step()
    assert not manager.has_pending_work()
    assert tier.stored_keys() == {key(1)}
    assert manager.get_stats().pinned_blocks == 0
    stats = manager.get_stats().tiers["t0"]
    assert stats["blocks_written"] == 1 and stats["bytes_written"] == SLOT


def test_a_put_stores_the_bytes_the_slot_holds_when_it_completes() -> None:
    manager, memory, (_tier,) = build(cpu_blocks=2)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1), key(2)], ctx)
    manager.step()
    evict_all(manager, memory)
    assert manager.lookup_prefix([key(1), key(2)], ctx) == [PENDING, PENDING]
    manager.step()
    assert [manager.lookup(k, ctx) for k in (key(1), key(2))] == [HIT, HIT]
    assert read(manager, memory, [key(1), key(2)], ctx) == [pattern(key(1)), pattern(key(2))]


def test_write_none_never_writes_but_serves_reads() -> None:
    manager, memory, (tier,) = build(cpu_blocks=2, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(7)], slot=1)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1)], ctx)
    manager.step()
    assert tier.stored_keys() == {key(7)}
    assert manager.lookup(key(7), ctx) is PENDING
    manager.step()
    assert read(manager, memory, [key(7)], ctx) == [pattern(key(7))]


def test_selective_writes_only_what_admission_admits_and_counts_the_rest() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, specs=[{"write_policy": "selective"}])
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1), key(2)], ctx)  # first offer of each
    manager.step()
    assert tier.stored_keys() == set()
    assert manager.get_stats().tiers["t0"]["drops"] == {"admission": 2}
    read(manager, memory, [key(1)], ReqContext(req_id="b"))  # a CPU hit: the second offer
    manager.step()
    assert tier.stored_keys() == {key(1)}


def test_selective_takes_a_caller_admission_filter() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=4,
        specs=[{"write_policy": "selective", "admission": StoreAfterNOffers(1)}],
    )
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    manager.step()
    assert tier.stored_keys() == {key(1)}


def test_write_back_writes_a_block_only_when_the_cpu_policy_evicts_it() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=4, specs=[{"write_policy": "write_back", "write_back_reserve_blocks": 1}]
    )
    ctx = ReqContext(req_id="a")
    for i in (1, 2, 3):  # one request each: key 1 is the least recent
        store(manager, memory, [key(i)], ReqContext(req_id=f"r{i}"))
    manager.step()
    assert tier.stored_keys() == set()  # one slot still free: the reserve holds
    assert manager.get_stats().pinned_blocks == 0  # nothing held: the CPU policy chooses
    store(manager, memory, [key(4)], ctx)
    manager.step()  # the CPU is full: its policy's next victim (LRU: key 1) goes ahead
    assert manager.cpu.slot_of(key(1)) is None and manager.cpu.lookup(key(1), ctx) is MISS
    stats = manager.get_stats()
    assert stats.held_blocks == 1 and stats.tiers["t0"]["write_back_blocks"] == 1
    assert stats.tiering["evicted_ahead"] == 1 and stats.evictions == 1
    assert manager.cpu.free_blocks == 0  # held, not free, until the tier has the bytes
    manager.step()
    assert tier.stored_keys() == {key(1)} and tier.record(key(1)) == pattern(key(1))
    stats = manager.get_stats()
    assert stats.held_blocks == 0 and manager.cpu.free_blocks == 1
    assert {key(2), key(3), key(4)} <= {k for k in map(key, range(5)) if manager.cpu.slot_of(k)}


def test_a_store_waits_for_a_slow_write_back_and_never_reuses_the_slot_early() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=2,
        specs=[{"write_policy": "write_back", "write_back_reserve_blocks": 1}],
        tier_kwargs=[{"latency_polls": 6}],
        write_back_wait_s=0.0,  # no waiting: the store is refused while key 1 is written
    )
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    store(manager, memory, [key(2)], ReqContext(req_id="a2"))
    victim_slot = manager.cpu.slot_of(key(1))
    other = ReqContext(req_id="b")
    assert manager.prepare_store([key(3)], other) is None  # key 1 is being written back
    assert manager.prepare_store([key(3)], other) is None  # still: and no second victim
    stats = manager.get_stats()
    assert stats.tiering["stores_waiting_write_back"] == 2
    assert stats.tiering["evicted_ahead"] == 1 and manager.cpu.slot_of(key(2)) is not None
    for _ in range(6):
        manager.step()
    assert tier.record(key(1)) == pattern(key(1))  # copied out before the slot was reused
    assert store(manager, memory, [key(3)], other) == [key(3)]
    assert manager.cpu.slot_of(key(3)) == victim_slot


def test_a_store_short_of_room_waits_for_its_write_backs_then_proceeds() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=2,
        specs=[{"write_policy": "write_back", "write_back_reserve_blocks": 1}],
        tier_kwargs=[{"latency_polls": 6}],
    )
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    store(manager, memory, [key(2)], ReqContext(req_id="b"))
    assert store(manager, memory, [key(3)], ReqContext(req_id="c")) == [key(3)]
    stats = manager.get_stats().tiering
    assert stats["write_back_waits"] == 1 and stats["stores_waiting_write_back"] == 0
    assert tier.record(key(1)) == pattern(key(1))  # written before its slot went to key 3


def test_write_back_frees_a_victim_the_tier_has_already_at_once() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=2, specs=[{"write_policy": "write_back", "write_back_reserve_blocks": 1}]
    )
    seed(tier, memory, [key(1)], slot=0)
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    store(manager, memory, [key(2)], ReqContext(req_id="b"))
    manager.step()  # key 1 is evicted ahead; the tier has it: nothing to write or wait for
    stats = manager.get_stats()
    assert stats.held_blocks == 0 and manager.cpu.free_blocks == 1
    assert stats.tiers["t0"]["already_stored"] == 1 and stats.tiers["t0"]["blocks_written"] == 0


def test_a_reset_keeps_a_write_back_slot_held_until_its_put_is_done() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=2,
        specs=[{"write_policy": "write_back", "write_back_reserve_blocks": 1}],
        tier_kwargs=[{"latency_polls": 5}],
        drain_timeout_s=0.0,
    )
    store(manager, memory, [key(1)], ReqContext(req_id="a"))
    store(manager, memory, [key(2)], ReqContext(req_id="b"))
    manager.step()
    assert manager.get_stats().held_blocks == 1
    tier.stuck = True  # the reset cannot drain it
    manager.reset_cache()
    assert manager.resetting and manager.get_stats().held_blocks == 1
    tier.stuck = False
    for _ in range(7):
        manager.step()
    assert not manager.resetting and not manager.has_pending_work()
    assert manager.get_stats().held_blocks == 0 and manager.cpu.free_blocks == 2
    assert tier.record(key(1)) == pattern(key(1))


def test_fill_writes_a_far_hit_into_nearer_tiers() -> None:
    manager, memory, (near, far) = build(
        cpu_blocks=2,
        tier_blocks=(8, 8),
        specs=[{"write_policy": "none", "fill": True}, {"write_policy": "none"}],
    )
    seed(far, memory, [key(5)], slot=0)
    ctx = ReqContext(req_id="a")
    assert manager.lookup(key(5), ctx) is PENDING
    manager.step()  # promotion completes, the fill put is submitted
    manager.step()  # the fill completes
    assert near.stored_keys() == {key(5)}
    assert manager.get_stats().pinned_blocks == 0


# ------------------------------------------------------------------ lookup / promotion
def test_prefix_promotion_is_one_job_per_tier_and_stops_at_the_first_gap() -> None:
    manager, memory, (t0, t1) = build(
        cpu_blocks=8, tier_blocks=(8, 8), specs=[{"write_policy": "none"}] * 2
    )
    seed(t0, memory, [key(0), key(2)], slot=0)
    seed(t1, memory, [key(1), key(4)], slot=0)
    gets = (t0.stats()["get_jobs"], t1.stats()["get_jobs"])
    ctx = ReqContext(req_id="a")
    keys = [key(i) for i in range(5)]
    assert manager.lookup_prefix(keys, ctx) == [PENDING, PENDING, PENDING, MISS, MISS]
    assert (t0.stats()["get_jobs"], t1.stats()["get_jobs"]) == (gets[0] + 1, gets[1] + 1)
    assert manager.cpu.slot_of(key(4)) is None  # after the gap: not promoted
    manager.step()
    assert manager.lookup_prefix(keys, ctx)[:3] == [HIT, HIT, HIT]
    assert read(manager, memory, keys[:3], ctx) == [pattern(k) for k in keys[:3]]


def test_single_key_lookups_batch_their_promotions_until_the_pass_ends() -> None:
    manager, memory, (tier,) = build(cpu_blocks=8, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(0), key(1), key(2)], slot=0)
    before = tier.stats()["get_jobs"]
    ctx = ReqContext(req_id="a")
    assert [manager.lookup(key(i), ctx) for i in range(4)] == [PENDING, PENDING, PENDING, MISS]
    assert tier.stats()["get_jobs"] == before + 1  # one job for the three
    manager.step()
    assert [manager.lookup(key(i), ctx) for i in range(3)] == [HIT] * 3


def test_asking_again_about_a_queued_promotion_submits_it() -> None:
    manager, memory, (tier,) = build(cpu_blocks=8, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(0)], slot=0)
    ctx = ReqContext(req_id="a")
    assert manager.lookup(key(0), ctx) is PENDING  # queued, the driver stopped here
    assert manager.has_pending_work()
    assert manager.lookup(key(0), ctx) is PENDING  # a new pass: submitted
    assert manager.lookup(key(0), ctx) is HIT


def test_a_failed_read_is_a_miss_and_is_not_promoted_again() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(0)], slot=0)
    tier.fail_keys[key(0)] = "io_error"
    ctx = ReqContext(req_id="a")
    assert manager.lookup_prefix([key(0)], ctx) == [PENDING]
    manager.step()
    gets = tier.stats()["get_jobs"]
    for _ in range(5):
        assert manager.lookup_prefix([key(0)], ctx) == [MISS]
        manager.step()
    assert tier.stats()["get_jobs"] == gets  # no retry loop
    stats = manager.get_stats()
    assert stats.stored_blocks == 0  # the slot was freed
    assert stats.tiers["t0"]["promotion_failures"] == 1


def test_unknown_presence_is_retry_a_bounded_number_of_times() -> None:
    manager, _memory, (tier,) = build(cpu_blocks=4, specs=[{"lookup_retries": 3}])
    tier.unknown_keys.add(key(0))
    ctx = ReqContext(req_id="a")
    assert [manager.lookup(key(0), ctx) for _ in range(5)] == [RETRY] * 3 + [MISS] * 2
    other = ReqContext(req_id="b")  # the bound is per request
    assert manager.lookup(key(0), other) is RETRY


def test_promotion_without_cpu_room_is_a_miss_and_counted() -> None:
    manager, memory, (tier,) = build(cpu_blocks=1, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(0)], slot=0)
    ctx = ReqContext(req_id="a")
    manager.prepare_store([key(9)], ctx)  # the only slot, still being written
    assert manager.lookup(key(0), ctx) is MISS
    assert manager.get_stats().tiering["promotion_allocation_failures"] == 1


# ------------------------------------------------------------------------ breaker
def test_breaker_opens_after_n_failures_probes_after_backoff_and_closes() -> None:
    clock = FakeClock()
    manager, memory, (tier,) = build(
        cpu_blocks=8,
        specs=[{"breaker_threshold": 2, "breaker_backoff_s": 10.0}],
        clock=clock,
    )
    tier.fail_all = "io_error"
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(0)], ctx)
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.CLOSED
    store(manager, memory, [key(1)], ctx)
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.OPEN
    lookups = manager.get_stats().tiers["t0"]["lookups"]
    store(manager, memory, [key(2)], ctx)  # skipped while open
    assert manager.lookup(key(50), ctx) is MISS
    stats = manager.get_stats().tiers["t0"]
    assert stats["drops"]["breaker_open"] == 1
    assert stats["lookups"] == lookups  # the tier was not asked
    tier.fail_all = None
    clock.now = 10.0  # back-off over: one probe
    store(manager, memory, [key(3)], ctx)
    assert breaker_state(manager, 0) is BreakerState.HALF_OPEN
    tier.stuck = True  # keep the probe in flight
    store(manager, memory, [key(4)], ctx)  # only one probe in flight
    assert manager.get_stats().tiers["t0"]["drops"]["breaker_open"] == 2
    tier.stuck = False
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.CLOSED
    assert key(3) in tier.stored_keys()


def test_a_failed_probe_reopens_with_a_longer_backoff() -> None:
    clock = FakeClock()
    manager, memory, (tier,) = build(
        cpu_blocks=8,
        specs=[{"breaker_threshold": 1, "breaker_backoff_s": 1.0, "breaker_max_backoff_s": 3.0}],
        clock=clock,
    )
    tier.fail_all = "io_error"
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(0)], ctx)
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.OPEN
    clock.now = 1.0
    store(manager, memory, [key(1)], ctx)  # the probe fails
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.OPEN
    clock.now = 2.5  # 1.5 s after the failed probe: the back-off is now 2 s
    store(manager, memory, [key(2)], ctx)
    assert breaker_state(manager, 0) is BreakerState.OPEN
    clock.now = 3.0
    tier.fail_all = None
    store(manager, memory, [key(3)], ctx)
    manager.step()
    assert breaker_state(manager, 0) is BreakerState.CLOSED
    assert manager.get_stats().tiers["t0"]["breaker_trips"] == 2


def test_benign_failures_do_not_trip_the_breaker() -> None:
    manager, memory, (_tier,) = build(
        cpu_blocks=8, tier_blocks=(0,), specs=[{"breaker_threshold": 1}]
    )
    ctx = ReqContext(req_id="a")
    for i in range(3):
        store(manager, memory, [key(i)], ctx)
        manager.step()
    assert breaker_state(manager, 0) is BreakerState.CLOSED
    assert manager.get_stats().tiers["t0"]["drops"] == {"failed_no_space": 3}


# --------------------------------------------------------------- in-flight bound
def test_in_flight_bytes_are_bounded_and_the_excess_is_counted() -> None:
    manager, memory, (_tier,) = build(
        cpu_blocks=8, specs=[{"max_inflight_bytes": 2 * SLOT}], tier_kwargs=[{"latency_polls": 5}]
    )
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(i) for i in range(5)], ctx)
    stats = manager.get_stats().tiers["t0"]
    assert stats["inflight_bytes"] == 2 * SLOT
    assert stats["drops"] == {"inflight_limit": 3}
    assert manager.get_stats().pinned_blocks == 2  # only the submitted ones hold a pin


def test_in_flight_bound_limits_promotions_too() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=8,
        specs=[{"write_policy": "none", "max_inflight_bytes": 2 * SLOT}],
    )
    seed(tier, memory, [key(i) for i in range(4)], slot=0)
    ctx = ReqContext(req_id="a")
    keys = [key(i) for i in range(4)]
    assert manager.lookup_prefix(keys, ctx) == [PENDING, PENDING, MISS, MISS]
    assert manager.get_stats().tiers["t0"]["drops"] == {"promotion_inflight_limit": 1}


# -------------------------------------------------------------------------- reset
def test_reset_drains_and_ignores_stale_completions() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, tier_kwargs=[{"latency_polls": 3}])
    seed(tier, memory, [key(9)], slot=0)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(0)], ctx)  # a put in flight
    assert manager.lookup(key(9), ctx) is PENDING
    manager.step()  # the promotion is in flight too
    manager.reset_cache()
    assert not manager.resetting
    stats = manager.get_stats()
    assert stats.stored_blocks == 0 and stats.pinned_blocks == 0
    assert stats.tiering["stale_completions"] == 2
    assert key(0) in tier.stored_keys()  # the tier keeps its records across a reset
    assert manager.lookup(key(9), ctx) is PENDING  # and serves them again
    manager.step()
    manager.step()
    manager.step()
    manager.step()
    assert read(manager, memory, [key(9)], ctx) == [pattern(key(9))]


def test_reset_with_nothing_in_flight_resets_the_cpu_at_once() -> None:
    manager, memory, _ = build(cpu_blocks=4)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(0)], ctx)
    manager.step()
    manager.reset_cache()
    assert not manager.resetting and not manager.has_pending_work()
    stats = manager.get_stats()
    assert stats.resets == 1 and stats.stored_blocks == 0
    assert stats.tiering["reset_timeouts"] == 0


def test_reset_with_a_stuck_tier_waits_for_its_old_jobs() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, drain_timeout_s=0.0)
    seed(tier, memory, [key(9)], slot=0)
    ctx = ReqContext(req_id="a")
    assert manager.lookup_prefix([key(9)], ctx) == [PENDING]
    tier.stuck = True
    manager.reset_cache()
    assert manager.resetting and manager.has_pending_work()
    assert manager.lookup(key(9), ctx) is MISS
    assert manager.prepare_store([key(1)], ctx) is None
    assert manager.get_stats().tiering["reset_timeouts"] == 1
    tier.stuck = False
    manager.step()  # the old job reports; the CPU reset happens now
    assert not manager.resetting
    stats = manager.get_stats()
    assert stats.stored_blocks == 0 and stats.resets == 1
    assert stats.tiering["stale_completions"] == 1
    assert store(manager, memory, [key(1)], ctx) == [key(1)]


def test_manager_checks_its_arguments() -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    cpu = CPUOffloadingManager(4)
    with pytest.raises(ValueError, match="slots"):
        TieringManager(cpu, memory)
    with pytest.raises(TypeError, match="CPUOffloadingManager"):
        TieringManager(object(), memory)  # type: ignore[arg-type]
    other = BytearraySlotMemory(SLOT, 4)
    with pytest.raises(ValueError, match="other host slots"):
        TieringManager(CPUOffloadingManager(2), memory, [MemoryTier(other, SLOT)])
    with pytest.raises(ValueError, match="write_policy must be one of"):
        SecondaryTier(MemoryTier(memory, SLOT), write_policy="sometimes")
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        SecondaryTier(MemoryTier(memory, SLOT), max_inflight_bytes=-1)


def test_stats_flatten_per_tier_counters() -> None:
    manager, memory, _ = build(cpu_blocks=2)
    store(manager, memory, [key(0)], ReqContext(req_id="a"))
    manager.step()
    flat = manager.get_stats().as_dict()
    assert flat["tier_t0_blocks_written"] == 1
    assert flat["tier_t0_breaker_state"] == "closed"
    assert flat["stores_completed"] == 1


def test_a_single_key_promotion_never_evicts_the_hits_of_the_same_pass() -> None:
    manager, memory, (tier,) = build(cpu_blocks=1, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(1)], slot=0)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(0)], ctx)
    assert manager.lookup(key(0), ctx) is HIT
    assert manager.lookup(key(1), ctx) is MISS  # promoting it would evict key 0: refused
    assert read(manager, memory, [key(0)], ctx) == [pattern(key(0))]
    other = ReqContext(req_id="b")  # a request whose pass starts at key 1 may evict key 0
    assert manager.lookup(key(1), other) is PENDING


def test_a_prefix_promotion_never_evicts_cpu_blocks_after_the_promoted_ones() -> None:
    manager, memory, (tier,) = build(cpu_blocks=2, specs=[{"write_policy": "none"}])
    seed(tier, memory, [key(0)], slot=0)
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(2), key(1)], ctx)  # key 2 is the CPU's LRU victim
    manager.cpu.touch([key(1)], None)
    keys = [key(0), key(1), key(2)]
    # Room for key 0 would mean evicting key 1 or 2, both in this prefix: the prefix ends at 0.
    assert manager.lookup_prefix(keys, ReqContext(req_id="b")) == [MISS, MISS, MISS]
    assert manager.cpu.slot_of(key(1)) is not None and manager.cpu.slot_of(key(2)) is not None


def test_a_promotion_cut_by_the_in_flight_bound_gives_slots_only_to_the_promoted_keys() -> None:
    manager, memory, (tier,) = build(
        cpu_blocks=8,
        specs=[{"write_policy": "none", "max_inflight_bytes": 2 * SLOT}],
    )
    keys = [key(i) for i in range(4)]
    seed(tier, memory, keys, slot=0)
    ctx = ReqContext(req_id="a")
    assert manager.lookup_prefix(keys, ctx) == [PENDING, PENDING, MISS, MISS]
    manager.step()  # both reads land
    stats = manager.get_stats()
    assert stats.tiers["t0"]["jobs_in_flight"] == 0
    assert stats.pending_blocks == 0  # the cut keys hold no slot that waits for nothing
    assert manager.cpu.free_blocks == 6
    assert [manager.cpu.lookup(k, ctx) for k in keys] == [HIT, HIT, MISS, MISS]
    # The rest of the prefix is promoted on the next pass, and every slot comes back.
    assert manager.lookup_prefix(keys, ctx) == [HIT, HIT, PENDING, PENDING]
    manager.step()
    assert read(manager, memory, keys, ctx) == [pattern(k) for k in keys]
    manager.reset_cache()
    stats = manager.get_stats()
    assert stats.held_blocks == 0 and manager.cpu.free_blocks == 8


def test_one_failed_read_holds_a_key_back_only_until_its_verdict_expires() -> None:
    clock = FakeClock()
    manager, memory, (tier,) = build(cpu_blocks=4, clock=clock)  # default: 10 s
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1)], ctx)
    manager.step()
    assert tier.stored_keys() == {key(1)}
    evict_all(manager, memory)
    tier.fail_keys[key(1)] = "io_error"  # fails once: the tier still holds the record
    assert manager.lookup_prefix([key(1)], ctx) == [PENDING]
    manager.step()
    del tier.fail_keys[key(1)]
    assert manager.get_stats().tiers["t0"]["promotion_failures"] == 1
    assert manager.lookup_prefix([key(1)], ctx) == [MISS]  # the verdict holds
    clock.now = 9.9
    assert manager.lookup_prefix([key(1)], ctx) == [MISS]
    clock.now = 10.0  # expired: promoted again, although write-through never re-puts it
    assert manager.lookup_prefix([key(1)], ctx) == [PENDING]
    manager.step()
    assert read(manager, memory, [key(1)], ctx) == [pattern(key(1))]
    assert manager.get_stats().tiers["t0"]["negative_keys"] == 0


def test_a_verdict_without_expiry_lasts_until_a_put_succeeds() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, negative_ttl_s=float("inf"))
    seed(tier, memory, [key(1)], slot=0)
    ctx = ReqContext(req_id="a")
    tier.fail_keys[key(1)] = "io_error"
    assert manager.lookup_prefix([key(1)], ctx) == [PENDING]
    manager.step()
    del tier.fail_keys[key(1)]
    assert manager.lookup_prefix([key(1)], ctx) == [MISS]
    with pytest.raises(ValueError, match="negative_ttl_s"):
        build(negative_ttl_s=-1.0)


def test_wait_steps_until_writes_and_promotions_land_or_the_timeout() -> None:
    manager, memory, (tier,) = build(cpu_blocks=2, tier_kwargs=[{"latency_polls": 3}])
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1), key(2)], ctx)
    assert manager.has_pending_work()
    assert manager.wait(5.0) and not manager.has_pending_work()
    assert tier.stored_keys() == {key(1), key(2)}  # the writes landed, no step() loop
    evict_all(manager, memory)
    assert manager.wait(5.0)  # the fillers' writes land and unpin their CPU slots
    assert manager.lookup_prefix([key(1), key(2)], ctx) == [PENDING, PENDING]
    assert manager.wait(5.0)
    assert manager.lookup_prefix([key(1), key(2)], ctx) == [HIT, HIT]
    tier.stuck = True  # a tier that never finishes: wait gives up at its deadline
    store(manager, memory, [key(3)], ReqContext(req_id="b"))
    assert manager.wait(0.05) is False and manager.has_pending_work()
    with pytest.raises(ValueError, match="timeout"):
        manager.wait(-1.0)


# ------------------------------------------------- the CPU tier's face for secondary tiers
def test_a_promotion_is_not_vetoed_by_the_cpus_store_admission() -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    tier = MemoryTier(memory, 16 * SLOT, name="t0")
    cpu = CPUOffloadingManager(2, store_threshold=2)  # a store is admitted on its 2nd offer
    manager = TieringManager(cpu, memory, [SecondaryTier(tier, write_policy="none")])
    seed(tier, memory, [key(7)], slot=1)
    ctx = ReqContext(req_id="a")
    # The block earned its place in the tier: its first lookup promotes it at once.
    assert manager.lookup_prefix([key(7)], ctx) == [PENDING]
    manager.step()
    assert manager.lookup(key(7), ctx) is HIT
    assert read(manager, memory, [key(7)], ctx) == [pattern(key(7))]
    stats = manager.get_stats()
    assert stats.admission_rejects == 0 and stats.tiers["t0"]["promotions"] == 1
    assert stats.stores_prepared == 0 and stats.stores_completed == 0  # not a store
    # A store from the engine still goes through admission.
    assert manager.prepare_store([key(8)], ctx) is not None
    assert manager.get_stats().admission_rejects == 1


def test_write_through_pins_are_not_loads() -> None:
    manager, memory, (tier,) = build(cpu_blocks=4, tier_kwargs=[{"latency_polls": 1}])
    ctx = ReqContext(req_id="a")
    store(manager, memory, [key(1), key(2), key(3)], ctx)
    assert manager.get_stats().pinned_blocks == 3  # the puts read the slots: pinned
    manager.wait(1.0)
    assert tier.stored_keys() == {key(1), key(2), key(3)}
    stats = manager.get_stats()
    assert stats.loads == 0 and stats.pinned_blocks == 0 and stats.evictable_blocks == 3
