"""Resets with jobs in flight (a vLLM-style driver), pending work, shutdown, and threads."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


# ------------------------------------------------------------------ a vLLM-style driver
@dataclass
class TransferJob:
    kind: str  # "load" reads its slots, "store" writes them
    keys: list[OffloadKey]
    slots: list[int]
    ctx: ReqContext


class Driver:
    """The call sequence of vLLM's offloading connector scheduler, with a worker whose jobs
    finish in any order, a few steps later (the data plane is only modelled: which slots each
    job in flight reads or writes)."""

    def __init__(self, m: CPUOffloadingManager, rng: random.Random, forget_at_reset: bool):
        self.m = m
        self.rng = rng
        self.forget_at_reset = forget_at_reset
        self.jobs: dict[int, TransferJob] = {}  # job id -> job the connector tracks
        self.orphans: list[TransferJob] = []  # jobs a reset made the connector forget
        self.next_id = 0
        self.stored = 0

    def check_no_slot_conflict(self) -> None:
        """No slot is written by one job while another job reads or writes it."""
        users: dict[int, list[str]] = {}
        for job in [*self.jobs.values(), *self.orphans]:
            for slot in set(job.slots):
                users.setdefault(slot, []).append(job.kind)
        for slot, kinds in users.items():
            assert "store" not in kinds or len(kinds) == 1, f"slot {slot} used by {kinds}"

    def submit(self, kind: str, keys: list[OffloadKey], slots: list[int], ctx: ReqContext) -> None:
        self.next_id += 1
        self.jobs[self.next_id] = TransferJob(kind, keys, slots, ctx)
        self.check_no_slot_conflict()

    def schedule(self, n: int) -> None:
        keys = [k(self.rng.randrange(24)) for _ in range(self.rng.randint(1, 5))]
        ctx = ReqContext(req_id=f"r{n}")
        self.m.on_new_request(ctx)
        hits = 0
        for key in keys:
            if self.m.lookup(key, ctx) is not LookupResult.HIT:
                break
            hits += 1
        if hits:
            spec = self.m.prepare_load(keys[:hits], ctx)
            self.submit("load", keys[:hits], spec.block_ids, ctx)
        out = self.m.prepare_store(keys[hits:], ctx)
        if out is not None and out.keys_to_store:
            self.submit("store", out.keys_to_store, out.store_spec.block_ids, ctx)
        self.m.on_request_finished(ctx)

    def finish_some(self) -> None:
        for job_id in [j for j in self.jobs if self.rng.random() < 0.4]:
            job = self.jobs.pop(job_id)
            if job.kind == "load":
                self.m.complete_load(job.keys, job.ctx)
            else:
                self.m.complete_store(job.keys, job.ctx, success=self.rng.random() < 0.9)
        if self.orphans and self.rng.random() < 0.3:  # the worker drained its old jobs
            self.orphans.clear()
            self.m.release_stale_slots()

    def reset(self) -> None:
        self.m.reset_cache()
        if self.forget_at_reset:  # as vLLM's connector clears its job maps on a reset
            self.orphans.extend(self.jobs.values())
            self.jobs.clear()


@pytest.mark.parametrize("forget_at_reset", [False, True])
@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "fifo", "2q"])
def test_a_reset_never_hands_out_a_slot_a_job_still_uses(
    policy: str, forget_at_reset: bool
) -> None:
    for seed in range(6):
        rng = random.Random(seed)
        m = CPUOffloadingManager(rng.randint(2, 8), cache_policy=policy)
        driver = Driver(m, rng, forget_at_reset)
        for step in range(150):
            driver.schedule(step)
            driver.finish_some()
            if rng.random() < 0.08:
                driver.reset()
            assert m.has_pending_work() is bool(
                driver.jobs or driver.orphans or m.get_stats().held_blocks
            )
        while driver.jobs:
            driver.finish_some()
        if driver.orphans:
            driver.orphans.clear()
            m.release_stale_slots()
        s = m.get_stats()
        assert (s.held_blocks, s.pending_blocks, s.pinned_blocks) == (0, 0, 0)
        assert not m.has_pending_work()
        assert s.stored_blocks == s.evictable_blocks <= m.num_blocks


def test_a_read_in_flight_keeps_its_slot_through_a_reset() -> None:
    m = CPUOffloadingManager(2)
    w = ReqContext(req_id="w")
    out = m.prepare_store([k(1)], w)
    assert out is not None and out.store_spec.block_ids == [0]
    m.complete_store([k(1)], w)
    reader = ReqContext(req_id="reader")
    assert m.prepare_load([k(1)], reader).block_ids == [0]
    m.reset_cache()
    w2 = ReqContext(req_id="w2")
    out = m.prepare_store([k(2)], w2)
    assert out is not None and out.store_spec.block_ids == [1]  # not slot 0: still being read
    assert m.prepare_store([k(3)], w2) is None
    m.complete_load([k(1)], reader)  # the stale completion gives slot 0 back
    out = m.prepare_store([k(3)], w2)
    assert out is not None and out.store_spec.block_ids == [0]
    assert m.get_stats().stale_completions == 1


def test_release_stale_slots_frees_held_slots_and_late_completions_are_ignored() -> None:
    m = CPUOffloadingManager(2)
    old = ReqContext(req_id="old")
    m.prepare_store([k(1), k(2)], old)
    m.reset_cache()
    assert m.get_stats().held_blocks == 2 and m.has_pending_work()
    assert m.release_stale_slots() == 2
    assert not m.has_pending_work()
    new = ReqContext(req_id="new")
    out = m.prepare_store([k(3), k(4)], new)
    assert out is not None and sorted(out.store_spec.block_ids) == [0, 1]
    m.complete_store([k(1), k(2)], old)  # late: changes nothing
    s = m.get_stats()
    assert (s.stale_completions, s.pending_blocks, s.held_blocks) == (2, 2, 0)


# ------------------------------------------------------------------ pending work, shutdown
def test_has_pending_work_while_a_store_or_a_load_is_in_flight() -> None:
    m = CPUOffloadingManager(4)
    assert not m.has_pending_work()
    c = ReqContext(req_id="r")
    m.prepare_store([k(1)], c)
    assert m.has_pending_work()
    m.complete_store([k(1)], c)
    assert not m.has_pending_work()
    m.prepare_load([k(1)], c)
    assert m.has_pending_work()
    m.complete_load([k(1)], c)
    assert not m.has_pending_work()


def test_shutdown_stops_the_manager() -> None:
    m = CPUOffloadingManager(4, enable_events=True)
    c = ReqContext(req_id="r")
    m.prepare_store([k(1)], c)
    m.complete_store([k(1)], c)
    m.shutdown()
    m.shutdown()  # idempotent
    calls = [
        lambda: m.lookup(k(1)),
        lambda: m.prepare_store([k(2)], c),
        lambda: m.prepare_store([], c),
        lambda: m.prepare_load([k(1)], c),
        lambda: m.complete_store([k(1)], c),
        lambda: m.complete_load([k(1)], c),
        lambda: m.touch([k(1)]),
        lambda: m.on_new_request(c),
        lambda: m.on_request_finished(c),
        lambda: m.take_events(),
        lambda: m.reset_cache(),
        lambda: m.release_stale_slots(),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="shut down"):
            call()
    assert m.get_stats().stored_blocks == 1  # the final counters stay readable
    assert m.is_shut_down and not m.has_pending_work()


# ------------------------------------------------------------------ threads
def _in_thread(fn: object) -> BaseException | None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return errors[0] if errors else None


def test_a_second_thread_is_refused_before_anything_changes() -> None:
    m = CPUOffloadingManager(4)
    c = ReqContext(req_id="r")
    out = m.prepare_store([k(1)], c)
    assert out is not None
    before = m.get_stats()
    error = _in_thread(lambda: m.complete_store([k(1)], c))
    assert isinstance(error, RuntimeError) and "thread_safe=True" in str(error)
    assert m.get_stats() == before
    assert _in_thread(m.get_stats) is None  # stats may be scraped from any thread
    m.complete_store([k(1)], c)  # the owning thread carries on
    assert m.lookup(k(1)) is LookupResult.HIT


def test_the_first_call_binds_the_thread_not_the_constructor() -> None:
    m = CPUOffloadingManager(4)
    c = ReqContext(req_id="r")
    assert _in_thread(lambda: m.prepare_store([k(1)], c)) is None
    with pytest.raises(RuntimeError, match="called from thread"):
        m.complete_store([k(1)], c)


def test_thread_safe_manager_is_a_locked_subclass_without_instance_wrappers() -> None:
    m = CPUOffloadingManager(4, thread_safe=True)
    assert isinstance(m, CPUOffloadingManager) and type(m) is not CPUOffloadingManager
    assert "lookup" not in vars(m) and "prepare_store" in vars(type(m))
    assert type(CPUOffloadingManager(2, thread_safe=True)) is type(m)  # made once
    c = ReqContext(req_id="r")
    m.prepare_store([k(1)], c)
    assert _in_thread(lambda: m.complete_store([k(1)], c)) is None
    assert m.lookup(k(1)) is LookupResult.HIT


def test_four_threads_without_a_lock_are_detected() -> None:
    m = CPUOffloadingManager(8)
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(t: int) -> None:
        barrier.wait()
        try:
            for i in range(50):
                c = ReqContext(req_id=f"{t}-{i}")
                out = m.prepare_store([k(t * 100 + i)], c)
                if out is not None:
                    m.complete_store(out.keys_to_store, c)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 3  # every thread but the first one to call
    s = m.get_stats()
    assert s.evictable_blocks == s.stored_blocks <= 8 and s.pending_blocks == 0
