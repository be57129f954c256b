"""Conformance suite for any :class:`~kvoffload.tiers.Tier` (ours or out of tree).

One line in a pytest file runs it::

    from kvoffload.testing.tiers import check_tier_conformance
    def test_my_tier_conforms(tmp_path):
        check_tier_conformance(lambda memory, records: MyTier(memory, ...))

``make_tier(memory, records)`` builds a fresh, empty tier over ``memory`` whose budget holds
exactly ``records`` slots. The checks, each on a fresh tier, raise :class:`TierConformanceError`
naming the rule broken: every job polled exactly once with its generation echoed; per-key
verdicts (a missing key fails alone); byte-exact round trips; ``contains`` answers at once even
while I/O is in flight; ``drain`` honours its deadline; the budget is never exceeded; records
being read or written are never evicted; deletes (of an absent key: a success, or a failure
with reason ``"missing"``); ``close`` reports what was in flight.

In-flight checks use :class:`GatedSlotMemory`: slot views of gated slots block the thread that
asks for them (up to a timeout) until the gate opens, which holds a tier's I/O mid-job. A
tier that copies synchronously inside ``submit_*`` never waits there, and the check then only
proves the weaker property that completed jobs did not evict pinned records.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import BytearraySlotMemory, Presence, Tier, TierResult

TierMaker = Callable[["GatedSlotMemory", int], Tier]

SLOT_BYTES = 4096 + 512  # not a power of two: catches code that assumes one


class TierConformanceError(AssertionError):
    """A tier broke a rule of the Tier contract."""


class GatedSlotMemory(BytearraySlotMemory):
    """Bytearray slots whose ``gated`` slots block other threads until :meth:`open_gate`."""

    def __init__(self, slot_bytes: int, num_slots: int, wait_s: float = 5.0) -> None:
        super().__init__(slot_bytes, num_slots)
        self.gated: set[int] = set()
        self._gate = threading.Event()
        self._gate.set()
        self._owner = threading.get_ident()
        self.wait_s = wait_s

    def close_gate(self, slots: Iterable[int]) -> None:
        self.gated = set(slots)
        self._owner = threading.get_ident()
        self._gate.clear()

    def open_gate(self) -> None:
        self._gate.set()

    def slot_view(self, slot: int) -> memoryview:
        if slot in self.gated and threading.get_ident() != self._owner:
            self._gate.wait(self.wait_s)
        return super().slot_view(slot)


def conformance_key(i: int) -> OffloadKey:
    return OffloadKey(b"tier-conf" + i.to_bytes(8, "big") + b"\x00\x00\x00\x00")


def _fail(rule: str, detail: str) -> TierConformanceError:
    return TierConformanceError(f"[{rule}] {detail}")


def _fill(memory: BytearraySlotMemory, slot: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(memory.slot_bytes)
    memory.slot_view(slot)[:] = data
    return data


_MAILBOX: dict[int, tuple[dict[int, TierResult], set[int]]] = {}


def _wait(tier: Tier, job_ids: Sequence[int], rule: str, timeout: float = 10.0) -> list[TierResult]:
    """Poll until every job in ``job_ids`` is reported; each must come back exactly once.

    Results of other jobs that arrive meanwhile are kept for a later call (a tier may finish
    jobs in any order); a job reported twice, across calls too, is an error.
    """
    stash, reported = _MAILBOX.setdefault(id(tier), ({}, set()))
    deadline = time.monotonic() + timeout
    while any(j not in stash for j in job_ids):
        if time.monotonic() > deadline:
            missing = sorted(j for j in job_ids if j not in stash)
            raise _fail(rule, f"jobs {missing} never reported by poll()")
        tier.drain(0.05)
        for result in tier.poll():
            if result.job_id in reported:
                raise _fail(rule, f"job {result.job_id} reported twice by poll()")
            reported.add(result.job_id)
            stash[result.job_id] = result
    out = [stash.pop(j) for j in job_ids]
    for result in out:
        if len(result.ok) != len(result.keys):
            raise _fail(
                rule, f"job {result.job_id}: {len(result.ok)} verdicts for {len(result.keys)} keys"
            )
    return out


def _forget(tier: Tier) -> None:
    _MAILBOX.pop(id(tier), None)


def check_round_trip(make: TierMaker) -> None:
    """Bytes stored from one slot come back byte for byte into another; generation echoed."""
    memory = GatedSlotMemory(SLOT_BYTES, 16)
    tier = make(memory, 8)
    try:
        keys = [conformance_key(i) for i in range(6)]
        data = [_fill(memory, i, 100 + i) for i in range(6)]
        (put,) = _wait(tier, [tier.submit_put(keys, list(range(6)), generation=7)], "round_trip")
        if not put.all_ok or put.generation != 7:
            raise _fail("round_trip", f"put of 6 keys into 8 records: {put}")
        for s in range(8, 14):
            memory.slot_view(s)[:] = bytes(memory.slot_bytes)
        (get,) = _wait(
            tier, [tier.submit_get(keys, list(range(8, 14)), generation=9)], "round_trip"
        )
        if not get.all_ok or get.generation != 9:
            raise _fail("round_trip", f"get of 6 stored keys: {get}")
        for i, expect in enumerate(data):
            if bytes(memory.slot_view(8 + i)) != expect:
                raise _fail("round_trip", f"key {i} came back with different bytes")
        (again,) = _wait(tier, [tier.submit_put(keys[:2], [0, 1])], "round_trip")
        if not again.all_ok:
            raise _fail(
                "round_trip", "putting a stored key again must succeed (records are immutable)"
            )
        if tier.poll() or _MAILBOX[id(tier)][0]:
            raise _fail("poll_once", "poll() after every job was reported returned more")
    finally:
        tier.close()
        _forget(tier)


def check_per_key_verdicts(make: TierMaker) -> None:
    """A get of stored and unknown keys fails exactly the unknown ones, with a reason."""
    memory = GatedSlotMemory(SLOT_BYTES, 8)
    tier = make(memory, 8)
    try:
        stored = [conformance_key(i) for i in range(3)]
        data = [_fill(memory, i, i) for i in range(3)]
        _wait(tier, [tier.submit_put(stored, [0, 1, 2])], "per_key")
        mixed = [stored[0], conformance_key(99), stored[2], conformance_key(98)]
        if tier.contains(mixed) != [Presence.HIT, Presence.MISS, Presence.HIT, Presence.MISS]:
            raise _fail("per_key", f"contains({mixed}) = {tier.contains(mixed)}")
        (get,) = _wait(tier, [tier.submit_get(mixed, [4, 5, 6, 7])], "per_key")
        if get.ok != (True, False, True, False):
            raise _fail("per_key", f"verdicts {get.ok}, expected (True, False, True, False)")
        if set(get.reasons) != {1, 3}:
            raise _fail("per_key", f"reasons must name the failed indices 1 and 3: {get.reasons}")
        if bytes(memory.slot_view(4)) != data[0] or bytes(memory.slot_view(6)) != data[2]:
            raise _fail("per_key", "a partly failed get corrupted the successful keys")
    finally:
        tier.close()
        _forget(tier)


def check_contains_and_drain_while_in_flight(make: TierMaker) -> None:
    """``contains`` answers and ``drain`` times out while I/O is held; then all completes."""
    memory = GatedSlotMemory(SLOT_BYTES, 8)
    tier = make(memory, 8)
    try:
        key = conformance_key(1)
        _fill(memory, 0, 1)
        memory.close_gate([0])
        job = tier.submit_put([key], [0])
        t0 = time.monotonic()
        presence = tier.contains([key, conformance_key(2)])
        drained = tier.drain(0.05)
        spent = time.monotonic() - t0
        memory.open_gate()
        if len(presence) != 2 or presence[1] is not Presence.MISS:
            raise _fail("contains", f"contains during a put: {presence}")
        if spent > 2.0:
            raise _fail("contains", f"contains + drain(0.05) took {spent:.2f} s while I/O was held")
        (put,) = _wait(tier, [job], "drain")
        if not put.all_ok:
            raise _fail("drain", f"a held put failed once released: {put}")
        if drained and tier.contains([key])[0] is not Presence.HIT:
            raise _fail("drain", "drain returned True but the put is not visible")
        if not tier.drain(5.0):
            raise _fail("drain", "drain(5) returned False with nothing in flight")
    finally:
        memory.open_gate()
        tier.close()
        _forget(tier)


def check_budget(make: TierMaker, records: int = 4) -> None:
    """Never more than ``records`` records readable; old ones evicted, new ones stored."""
    memory = GatedSlotMemory(SLOT_BYTES, 4)
    tier = make(memory, records)
    try:
        stored = 0
        all_keys = []
        for batch in range(5):
            keys = [conformance_key(1000 + batch * 3 + i) for i in range(3)]
            all_keys += keys
            for i in range(3):
                _fill(memory, i, batch * 3 + i)
            (put,) = _wait(tier, [tier.submit_put(keys, [0, 1, 2])], "budget")
            stored += sum(put.ok)
            hits = tier.contains(all_keys).count(Presence.HIT)
            if hits > records:
                raise _fail("budget", f"{hits} records readable with a budget of {records}")
            used = tier.stats().get("used_bytes")
            cap = tier.stats().get("capacity_bytes")
            if used is not None and cap is not None and used > cap:
                raise _fail("budget", f"used_bytes {used} > capacity_bytes {cap}")
        if stored < 5 * 3 - 1:
            raise _fail("budget", f"only {stored} of 15 puts stored: eviction does not make room")
    finally:
        tier.close()
        _forget(tier)


def check_in_flight_not_evicted(make: TierMaker) -> None:
    """A record being read or written is never evicted by puts that need room meanwhile."""
    memory = GatedSlotMemory(SLOT_BYTES, 8)
    tier = make(memory, 2)
    try:
        reading, writing = conformance_key(1), conformance_key(2)
        want_read = _fill(memory, 0, 1)
        _wait(tier, [tier.submit_put([reading], [0])], "in_flight")
        want_write = _fill(memory, 1, 2)
        memory.close_gate([1, 2])
        held_put = tier.submit_put([writing], [1])
        held_get = tier.submit_get([reading], [2])
        others = []
        for i in range(3):
            _fill(memory, 3 + i, 10 + i)
            others.append(tier.submit_put([conformance_key(50 + i)], [3 + i]))
        # let the unheld puts finish before the held jobs are released
        other_results = _wait(tier, others, "in_flight")
        memory.open_gate()
        put, get = _wait(tier, [held_put, held_get], "in_flight")
        for result in other_results:
            if reading in result.evicted or writing in result.evicted:
                raise _fail("in_flight", f"a put evicted a record in flight: {result}")
        if not put.all_ok or not get.all_ok:
            raise _fail("in_flight", f"held jobs failed: put {put}, get {get}")
        if bytes(memory.slot_view(2)) != want_read:
            raise _fail("in_flight", "the held get returned different bytes")
        memory.slot_view(7)[:] = bytes(memory.slot_bytes)
        (back,) = _wait(tier, [tier.submit_get([writing], [7])], "in_flight")
        if back.all_ok and bytes(memory.slot_view(7)) != want_write:
            raise _fail("in_flight", "the held put stored different bytes")
    finally:
        memory.open_gate()
        tier.close()
        _forget(tier)


def check_delete(make: TierMaker) -> None:
    """A deleted record is gone (a miss and a failed get); an absent key is reported sanely."""
    memory = GatedSlotMemory(SLOT_BYTES, 4)
    tier = make(memory, 4)
    try:
        if not tier.capabilities.supports_delete:
            return
        key = conformance_key(5)
        _fill(memory, 0, 5)
        _wait(tier, [tier.submit_put([key], [0])], "delete")
        (gone,) = _wait(
            tier, [tier.submit_delete([key, conformance_key(6)], generation=3)], "delete"
        )
        # an absent key is gone: either a success or a failure that says "missing"
        absent_ok = gone.ok[1] or gone.reasons.get(1) == "missing"
        if not gone.ok[0] or not absent_ok or gone.generation != 3:
            raise _fail("delete", f"delete of a stored and an absent key: {gone}")
        if tier.contains([key]) != [Presence.MISS]:
            raise _fail("delete", "a deleted key is still present")
        (get,) = _wait(tier, [tier.submit_get([key], [1])], "delete")
        if get.ok != (False,):
            raise _fail("delete", "a deleted key was served")
    finally:
        tier.close()
        _forget(tier)


def check_close_reports_in_flight(make: TierMaker) -> None:
    """Jobs in flight at ``close`` are still reported once (completed or failed)."""
    memory = GatedSlotMemory(SLOT_BYTES, 8, wait_s=0.2)
    tier = make(memory, 8)
    _fill(memory, 0, 1)
    memory.close_gate([0])
    jobs = [tier.submit_put([conformance_key(i)], [0]) for i in range(4)]
    tier.close()
    memory.open_gate()
    seen: dict[int, TierResult] = {}
    for result in tier.poll():
        if result.job_id in seen:
            raise _fail("close", f"job {result.job_id} reported twice")
        seen[result.job_id] = result
    if set(seen) != set(jobs):
        raise _fail("close", f"after close, poll reported {sorted(seen)} of jobs {jobs}")


def check_closed_rule(make: TierMaker) -> None:
    """After ``close`` nothing is served and nothing raises: ``contains`` answers MISS and
    every job (put, get, delete) is reported once, each key failed as ``"closed"``."""
    memory = BytearraySlotMemory(SLOT_BYTES, 2)
    tier = make(memory, 4)
    key = conformance_key(0)
    _fill(memory, 0, 1)
    _wait(tier, [tier.submit_put([key], [0])], "closed")
    tier.close()
    _forget(tier)
    try:
        jobs = [
            tier.submit_put([conformance_key(1), conformance_key(2)], [0, 1]),
            tier.submit_get([key], [1]),
            tier.submit_delete([key]),
        ]
        presence = tier.contains([key])
    except Exception as exc:
        raise _fail("closed", f"a call after close raised {exc!r}") from exc
    if presence != [Presence.MISS]:
        raise _fail("closed", f"contains after close answered {presence}")
    if not tier.drain(1.0):
        raise _fail("closed", "drain after close did not return True at once")
    results = {r.job_id: r for r in tier.poll()}
    if sorted(results) != sorted(jobs):
        raise _fail("closed", f"after close, poll reported {sorted(results)} of jobs {jobs}")
    for result in results.values():
        want = dict.fromkeys(range(len(result.keys)), "closed")
        if any(result.ok) or dict(result.reasons) != want:
            raise _fail("closed", f"a {result.kind.value} after close came back {result}")


ALL_CHECKS: tuple[Callable[[TierMaker], None], ...] = (
    check_round_trip,
    check_per_key_verdicts,
    check_contains_and_drain_while_in_flight,
    check_budget,
    check_in_flight_not_evicted,
    check_delete,
    check_close_reports_in_flight,
    check_closed_rule,
)


BUDGET_CHECKS = (check_budget, check_in_flight_not_evicted)


def check_tier_conformance(make_tier: TierMaker, *, client_budget: bool = True) -> None:
    """Run every check, each on a fresh tier from ``make_tier``; raise on the first failure.

    ``client_budget=False`` is for a shared store whose byte budget and eviction belong to
    the server (Redis ``maxmemory``): the two budget checks are left out.
    """
    for check in ALL_CHECKS:
        if client_budget or check not in BUDGET_CHECKS:
            check(make_tier)


__all__ = [
    "ALL_CHECKS",
    "BUDGET_CHECKS",
    "SLOT_BYTES",
    "GatedSlotMemory",
    "TierConformanceError",
    "TierMaker",
    "check_tier_conformance",
    "conformance_key",
]
