"""MemoryTier: budget, policy eviction, in-flight protection, completion-time copies, faults."""

from __future__ import annotations

import pytest
from tier_helpers import SLOT, FakeClock, key, pattern

from kvoffload.tiers import BytearraySlotMemory, JobKind, MemoryTier, Presence


def put(tier: MemoryTier, memory: BytearraySlotMemory, i: int, slot: int = 0) -> int:
    memory.slot_view(slot)[:] = pattern(key(i))
    return tier.submit_put([key(i)], [slot])


def test_budget_is_in_records_and_eviction_follows_the_policy() -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    tier = MemoryTier(memory, 3 * SLOT + SLOT // 2, "lru")  # 3.5 slots: 3 records
    for i in range(3):
        put(tier, memory, i)
        tier.poll()
    tier.submit_get([key(0)], [1])  # key 0 becomes the most recent
    tier.poll()
    put(tier, memory, 3)
    (result,) = tier.poll()
    assert result.all_ok and result.evicted == (key(1),)
    assert tier.stored_keys() == {key(0), key(2), key(3)}
    assert tier.stats()["used_bytes"] == 3 * SLOT


def test_records_in_flight_are_never_evicted() -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    tier = MemoryTier(memory, SLOT)
    put(tier, memory, 0)
    tier.poll()
    tier.submit_get([key(0)], [1])  # pinned until polled
    put(tier, memory, 1)
    results = {r.kind: r for r in tier.poll()}
    assert results[JobKind.PUT].reasons == {0: "no_space"}
    assert results[JobKind.GET].all_ok
    assert bytes(memory.slot_view(1)) == pattern(key(0))


def test_bytes_are_copied_when_the_job_completes() -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    tier = MemoryTier(memory, 4 * SLOT, latency_polls=1)
    put(tier, memory, 0)
    assert tier.poll() == []  # one poll of latency
    assert tier.contains([key(0)]) == [Presence.MISS]  # not readable while being written
    memory.slot_view(0)[:] = pattern(key(5))  # the caller broke the contract
    (result,) = tier.poll()
    assert result.all_ok and result.nbytes == SLOT
    assert tier.record(key(0)) == pattern(key(5))


def test_latency_in_seconds_uses_the_clock() -> None:
    clock = FakeClock()
    memory = BytearraySlotMemory(SLOT, 1)
    tier = MemoryTier(memory, 4 * SLOT, latency_s=2.0, clock=clock)
    put(tier, memory, 0)
    assert tier.poll() == []
    clock.now = 2.0
    (result,) = tier.poll()
    assert result.seconds == 2.0


def test_faults_are_per_key_verdicts_and_corrupt_records_are_dropped() -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    tier = MemoryTier(memory, 4 * SLOT)
    put(tier, memory, 0)
    tier.poll()
    tier.fail_keys[key(0)] = "corrupt"
    tier.submit_get([key(0), key(9)], [0, 1])
    (result,) = tier.poll()
    assert result.ok == (False, False)
    assert dict(result.reasons) == {0: "corrupt", 1: "missing"}
    assert tier.stored_keys() == set()  # never served again
    tier.fail_all = "io_error"
    assert not tier.health().ok
    put(tier, memory, 1)
    assert tier.poll()[0].reasons == {0: "io_error"}


def test_unknown_presence_and_stuck_jobs() -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    tier = MemoryTier(memory, 4 * SLOT)
    tier.unknown_keys.add(key(3))
    assert tier.contains([key(3)]) == [Presence.UNKNOWN]
    tier.stuck = True
    put(tier, memory, 0)
    assert tier.poll() == [] and not tier.drain(0.0)
    tier.stuck = False
    assert tier.drain(0.0)
    assert [r.all_ok for r in tier.poll()] == [True]


def test_close_cancels_jobs_in_flight_and_releases_them() -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    tier = MemoryTier(memory, 4 * SLOT, latency_polls=5)
    put(tier, memory, 0)
    tier.close()
    (result,) = tier.poll()
    assert result.reasons == {0: "cancelled"}
    assert tier.stored_keys() == set() and tier.in_flight_keys() == set()
    job = put(tier, memory, 1)  # the one closed rule: reported, every key "closed"
    (late,) = tier.poll()
    assert late.job_id == job and late.reasons == {0: "closed"} and not late.all_ok


def test_delete_and_scan() -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    tier = MemoryTier(memory, 4 * SLOT)
    for i in range(2):
        put(tier, memory, i)
        tier.poll()
    assert {b.key for b in tier.scan()} == {key(0), key(1)}
    tier.submit_delete([key(0), key(7)])
    (result,) = tier.poll()
    assert result.ok == (True, False)
    assert {b.key for b in tier.scan()} == {key(1)}


def test_arguments_are_checked() -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    with pytest.raises(ValueError, match="capacity_bytes"):
        MemoryTier(memory, -1)
    with pytest.raises(TypeError, match="latency_s"):
        MemoryTier(memory, SLOT, latency_s="1")  # type: ignore[arg-type]
    tier = MemoryTier(memory, SLOT, max_batch=1)
    with pytest.raises(ValueError, match="max_batch"):
        tier.submit_get([key(0), key(1)], [0, 0])
    with pytest.raises(ValueError, match="slot must be"):
        tier.submit_put([key(0)], [3])
    # the batch rule every tier shares (tiers.runtime.check_batch)
    with pytest.raises(TypeError, match=r"a single key is \[key\]"):
        tier.submit_put(key(0), [0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="slots must be ints"):
        tier.submit_put([key(0)], [True])


def test_registered_by_name() -> None:
    from kvoffload.tiers.registry import available_tiers, get_tier_cls

    assert "memory" in available_tiers()
    assert get_tier_cls("memory") is MemoryTier
