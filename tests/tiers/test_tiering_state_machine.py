"""A hypothesis state machine for the TieringManager: a CPU tier and two memory tiers.

The driver writes a key-derived pattern into every slot it stores, so "a hit returns the bytes
stored" is checkable byte for byte; random lookups, stores (completed with success or
failure, in any order), loads, steps, tier faults (failing keys, failing tiers, UNKNOWN
presence, stuck tiers), clock jumps (breaker probes) and resets are interleaved, and after
every step the invariants below are checked against the manager, its CPU tier and the tiers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tier_helpers import SLOT, FakeClock, key, pattern

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.breaker import BreakerState
from kvoffload.tiers.manager import SecondaryTier, TieringManager, breaker_state

CPU_BLOCKS = 4
UNIVERSE = 12
KEYS = [key(i) for i in range(UNIVERSE)]
GARBAGE = b"\xee" * SLOT

HIT, MISS = LookupResult.HIT, LookupResult.MISS
PENDING, RETRY = LookupResult.HIT_PENDING, LookupResult.RETRY


@dataclass
class DriverStore:
    keys: list[bytes]
    slots: list[int]
    ctx: ReqContext
    generation: int


@dataclass
class DriverLoad:
    keys: list[bytes]
    slots: list[int]
    ctx: ReqContext
    generation: int


class TieringMachine(RuleBasedStateMachine):
    @initialize(
        second=st.sampled_from(["write_back", "selective", "write_through"]),
        latency=st.integers(0, 2),
    )
    def setup(self, second: str, latency: int) -> None:
        self.clock = FakeClock()
        self.memory = BytearraySlotMemory(SLOT, CPU_BLOCKS)
        self.cpu = CPUOffloadingManager(CPU_BLOCKS)
        self.tiers = [
            MemoryTier(
                self.memory, 6 * SLOT, "lru", name="near", latency_polls=latency, clock=self.clock
            ),
            MemoryTier(self.memory, 10 * SLOT, "arc", name="far", clock=self.clock),
        ]
        self.manager = TieringManager(
            self.cpu,
            self.memory,
            [
                SecondaryTier(
                    self.tiers[0],
                    "write_through",
                    fill=True,
                    breaker_threshold=2,
                    breaker_backoff_s=1.0,
                ),
                SecondaryTier(
                    self.tiers[1],
                    second,
                    max_inflight_bytes=3 * SLOT,
                    write_back_reserve_blocks=1,
                    breaker_threshold=3,
                    breaker_backoff_s=2.0,
                    lookup_retries=2,
                ),
            ],
            clock=self.clock,
            drain_timeout_s=0.0,
        )
        self.ctxs = [ReqContext(req_id=f"r{i}") for i in range(3)]
        self.stores: list[DriverStore] = []
        self.loads: list[DriverLoad] = []
        self.stored_ever: set[bytes] = set()  # keys a driver store completed successfully
        self.jobs_seen = [0, 0]
        self.open_since: list[float | None] = [None, None]

    # ------------------------------------------------------------------ driver
    @rule(req=st.integers(0, 2), start=st.integers(0, UNIVERSE - 1), n=st.integers(1, 4))
    def prepare_store(self, req: int, start: int, n: int) -> None:
        ctx = self.ctxs[req]
        keys = KEYS[start : start + n]
        out = self.manager.prepare_store(keys, ctx)
        if out is None:
            return
        assert set(out.keys_to_store) <= set(keys)
        if out.keys_to_store:
            self.stores.append(
                DriverStore(
                    list(out.keys_to_store),
                    list(out.store_spec.block_ids),
                    ctx,
                    self.manager.generation,
                )
            )

    @rule(
        req=st.integers(0, 2),
        start=st.integers(0, UNIVERSE - 1),
        n=st.integers(1, 3),
        fail=st.integers(0, 4),
    )
    def store_now(self, req: int, start: int, n: int, fail: int) -> None:
        """The common path: a store whose copy completes at once (fails one time in five)."""
        ctx = self.ctxs[req]
        out = self.manager.prepare_store(KEYS[start : start + n], ctx)
        if out is None or not out.keys_to_store:
            return
        for k, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
            self.memory.slot_view(slot)[:] = pattern(k) if fail else GARBAGE
        self.manager.complete_store(out.keys_to_store, ctx, success=bool(fail))
        if fail:
            self.stored_ever.update(out.keys_to_store)

    @precondition(lambda self: self.stores)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        job = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1)))
        if job.generation == self.manager.generation:  # a stale job's slots are not its own
            for k, slot in zip(job.keys, job.slots, strict=True):
                self.memory.slot_view(slot)[:] = pattern(k) if success else GARBAGE
        self.manager.complete_store(job.keys, job.ctx, success)
        if success and job.generation == self.manager.generation:
            self.stored_ever.update(job.keys)

    @rule(req=st.integers(0, 2), start=st.integers(0, UNIVERSE - 1), n=st.integers(1, 5))
    def lookup_prefix(self, req: int, start: int, n: int) -> None:
        ctx = self.ctxs[req]
        keys = KEYS[start : start + n]
        results = self.manager.lookup_prefix(keys, ctx)
        assert len(results) == len(keys)
        ended = False
        for k, result in zip(keys, results, strict=True):
            if ended:
                assert result is MISS, "nothing after the end of the prefix"
                continue
            if result in (MISS, RETRY):
                ended = True
                continue
            assert self.manager.cpu.slot_of(k) is not None  # HIT and HIT_PENDING hold a slot
            assert k in self.stored_ever or result is PENDING or self._cpu_ready(k)
        hits = []
        for k, result in zip(keys, results, strict=True):
            if result is not HIT:
                break
            hits.append(k)
        if hits:
            spec = self.manager.prepare_load(hits, ctx)
            self.loads.append(DriverLoad(hits, list(spec.block_ids), ctx, self.manager.generation))

    @rule(req=st.integers(0, 2), i=st.integers(0, UNIVERSE - 1))
    def lookup_one(self, req: int, i: int) -> None:
        result = self.manager.lookup(KEYS[i], self.ctxs[req])
        if result in (HIT, PENDING):
            assert self.manager.cpu.slot_of(KEYS[i]) is not None

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        job = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
        if job.generation == self.manager.generation:
            for k, slot in zip(job.keys, job.slots, strict=True):
                assert bytes(self.memory.slot_view(slot)) == pattern(k), (
                    "a hit returned other bytes"
                )
        self.manager.complete_load(job.keys, job.ctx)

    @rule(req=st.integers(0, 2))
    def finish_request(self, req: int) -> None:
        self.manager.on_request_finished(self.ctxs[req])

    @rule()
    def step(self) -> None:
        for tier in self.tiers:  # a stuck tier recovers by the next step
            tier.stuck = False
        self.manager.step()

    # ------------------------------------------------------------------ faults
    @rule(
        kind=st.sampled_from(
            [
                "fail_tier",
                "clear_tier",
                "fail_key",
                "clear_key",
                "unknown",
                "known",
                "stuck",
                "clock",
            ]
        ),
        t=st.integers(0, 1),
        i=st.integers(0, UNIVERSE - 1),
        reason=st.sampled_from(["io_error", "no_space"]),
        dt=st.sampled_from([0.5, 1.0, 3.0]),
    )
    def fault(self, kind: str, t: int, i: int, reason: str, dt: float) -> None:
        tier = self.tiers[t]
        if kind == "fail_tier":
            tier.fail_all = reason
        elif kind == "clear_tier":
            tier.fail_all = None
        elif kind == "fail_key":
            tier.fail_keys[KEYS[i]] = "corrupt"
        elif kind == "clear_key":
            tier.fail_keys.pop(KEYS[i], None)
        elif kind == "unknown":
            tier.unknown_keys.add(KEYS[i])
        elif kind == "known":
            tier.unknown_keys.discard(KEYS[i])
        elif kind == "stuck":
            tier.stuck = True
        else:
            self.clock.now += dt

    @rule(go=st.integers(0, 3))
    def reset(self, go: int) -> None:
        if go:  # resets are rarer than the other steps
            self.manager.step()
            return
        # The engine's own copies land before it resets (their completions may come later).
        for job in self.stores:
            if job.generation == self.manager.generation:
                for k, slot in zip(job.keys, job.slots, strict=True):
                    self.memory.slot_view(slot)[:] = pattern(k)
        self.manager.reset_cache()
        if self.manager.resetting:
            assert self.manager.has_pending_work()
        # Their completions arrive after the reset: stale, ignored. (They arrive before the same
        # request prepares the same key again: the CPU manager's completions carry no
        # generation, so it could not tell an old completion from a new one.)
        for job in self.stores:
            self.manager.complete_store(job.keys, job.ctx, success=True)
        for job in self.loads:
            self.manager.complete_load(job.keys, job.ctx)
        self.stores.clear()
        self.loads.clear()

    # -------------------------------------------------------------- invariants
    def _cpu_ready(self, k: bytes) -> bool:
        status = self.cpu.policy.get(k)
        return status is not None and status.ref_cnt >= 0

    @invariant()
    def no_slot_owned_twice_and_the_mirror_agrees(self) -> None:
        slots = {}
        for k in KEYS:
            status = self.cpu.policy.get(k)
            assert self.manager.cpu.slot_of(k) == (status.block_id if status else None)
            if status is not None:
                assert status.block_id not in slots, "two blocks in one slot"
                slots[status.block_id] = k

    @invariant()
    def ready_cpu_blocks_hold_their_bytes(self) -> None:
        for k in KEYS:
            status = self.cpu.policy.get(k)
            if status is not None and status.ref_cnt >= 0:
                assert bytes(self.memory.slot_view(status.block_id)) == pattern(k)

    @invariant()
    def tier_records_are_the_bytes_stored(self) -> None:
        for tier in self.tiers:
            for k in tier.stored_keys():
                assert tier.record(k) == pattern(k), f"{tier.name} holds wrong bytes"

    @invariant()
    def nothing_pinned_or_pending_is_evicted(self) -> None:
        for job in self.loads + self.stores:
            if job.generation != self.manager.generation or self.manager.resetting:
                continue
            for k, slot in zip(job.keys, job.slots, strict=True):
                status = self.cpu.policy.get(k)
                assert status is not None and status.block_id == slot
        for tier in self.tiers:
            for k in tier.in_flight_keys():
                assert tier.policy.get(k) is not None, "a tier evicted a block in flight"

    @invariant()
    def open_breakers_send_nothing(self) -> None:
        for t, tier in enumerate(self.tiers):
            jobs = tier.stats()["put_jobs"] + tier.stats()["get_jobs"]
            state = breaker_state(self.manager, t)
            if state is BreakerState.OPEN:
                if self.open_since[t] is not None and self.jobs_seen[t] != jobs:
                    raise AssertionError(f"tier {tier.name} got a job while its breaker was open")
                self.open_since[t] = self.clock.now
            else:
                self.open_since[t] = None
            self.jobs_seen[t] = jobs

    @invariant()
    def stats_are_consistent(self) -> None:
        stats = self.manager.get_stats()
        assert stats.pinned_blocks >= 0 and stats.evictable_blocks >= 0
        for tier_stats in stats.tiers.values():
            assert tier_stats["inflight_bytes"] >= 0
        if not self.manager.has_pending_work():
            assert all(not tier.in_flight_keys() for tier in self.tiers)


TieringMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_tiering_state_machine = TieringMachine.TestCase
