"""``MemoryTier``: a byte-bounded :class:`~kvoffload.tiers.base.Tier` that keeps records in a dict.

Why it exists: tests of the tiering manager and the simulator's simulated tiers need a tier
that behaves like an asynchronous one (jobs finish only when polled, after a configurable
number of polls or seconds, and may fail) without files or sockets. Bytes are copied when a
job *completes*, not when it is submitted, so a caller that reuses a host slot before a put
is polled stores the wrong bytes here, exactly as it would on a real disk: the tests catch it.

Faults are injected through plain attributes (``fail_keys``, ``fail_all``, ``unknown_keys``,
``stuck``) so a test can switch them between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload._checks import check_int
from kvoffload.keys import OffloadKey
from kvoffload.manager.ledger import BlockLedger
from kvoffload.policies import BlockStatus, CachePolicy, create_cache_policy
from kvoffload.tiers.base import (
    JobKind,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierResult,
    TierStats,
    check_seconds,
)
from kvoffload.tiers.runtime import CANCELLED, Job, TierRuntime, check_batch


@dataclass
class _Pending:
    """A job's schedule: it completes when polled, after its latency."""

    job: Job
    slots: tuple[int, ...]
    ready_at: float
    polls_left: int
    fail: dict[int, str] = field(default_factory=dict)  # index -> reason, decided at submit
    skip: set[int] = field(default_factory=set)  # puts of keys already stored: no write


class MemoryTier(Tier):
    """An in-memory tier of ``capacity_bytes`` (one record = one host slot).

    Args:
        memory: the host slots jobs read from and write into.
        capacity_bytes: byte budget; it holds ``capacity_bytes // memory.slot_bytes`` records.
        policy: eviction policy name from the registry (``"lru"``, ``"arc"``, ...) or an instance.
        policy_params: keyword parameters for the policy.
        max_batch: the most keys one job may carry (declared in its capabilities).
        latency_polls: a job completes on the ``latency_polls + 1``-th poll after submission.
        latency_s: ... and no sooner than ``latency_s`` seconds (on ``clock``) after it.
        clock: time source (injectable for tests).
        name: label in stats (default ``"memory"``).

    Fault injection (attributes, change them any time): ``fail_keys`` maps a key to the
    reason its puts and gets fail with; ``fail_all`` (a reason or ``None``) fails every key
    of jobs submitted while it is set; ``unknown_keys`` answer ``UNKNOWN`` in ``contains``;
    ``stuck`` keeps jobs from completing (``drain`` then returns False at once).
    """

    def __init__(
        self,
        memory: SlotMemory,
        capacity_bytes: int,
        policy: str | CachePolicy = "lru",
        policy_params: Mapping[str, Any] | None = None,
        *,
        max_batch: int = 0,
        latency_polls: int = 0,
        latency_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        name: str = "memory",
    ) -> None:
        super().__init__(memory)
        check_int("capacity_bytes", capacity_bytes, 0)
        check_int("max_batch", max_batch, 0, why=" (0: no limit)")
        check_int("latency_polls", latency_polls, 0)
        check_seconds("latency_s", latency_s)
        self.name = name
        self.capacity_bytes = capacity_bytes
        self.capacity_blocks = capacity_bytes // memory.slot_bytes
        if isinstance(policy, CachePolicy):
            if policy_params:
                raise ValueError("policy_params cannot be used with a policy instance")
        else:
            policy = create_cache_policy(
                policy, self.capacity_blocks, None, dict(policy_params or {})
            )
        # The records' pins and pending writes, one slot per record of the capacity.
        self._ledger = BlockLedger(policy, self.capacity_blocks)
        self._caps = TierCapabilities(max_batch=max_batch)
        self.latency_polls = latency_polls
        self.latency_s = float(latency_s)
        self._clock = clock
        self._records: dict[OffloadKey, bytes] = {}
        self._runtime = TierRuntime(0, clock=clock)
        self._jobs: list[_Pending] = []
        self.fail_keys: dict[OffloadKey, str] = {}
        self.fail_all: str | None = None
        self.unknown_keys: set[OffloadKey] = set()
        self.stuck = False
        self._stats: dict[str, float] = dict.fromkeys(
            (
                "puts",
                "gets",
                "put_jobs",
                "get_jobs",
                "delete_jobs",
                "stored",
                "hits",
                "deletes",
                "evictions",
                "failed_keys",
                "bad_records",
                "bytes_written",
                "bytes_read",
            ),
            0.0,
        )

    # ----------------------------------------------------------------- contract
    @property
    def capabilities(self) -> TierCapabilities:
        return self._caps

    @property
    def policy(self) -> CachePolicy:
        """The tier's eviction policy (read-only access for tests)."""
        return self._ledger.policy

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        if self._runtime.closed:  # nothing is served after close
            return [Presence.MISS] * len(keys)
        out = []
        get = self._ledger.get
        for key in keys:
            if key in self.unknown_keys:
                out.append(Presence.UNKNOWN)
                continue
            status = get(key)
            out.append(
                Presence.HIT if status is not None and status.ref_cnt >= 0 else Presence.MISS
            )
        return out

    def stored_keys(self) -> set[OffloadKey]:
        """Keys whose record is readable now (for tests and the simulator)."""
        return set(self._records)

    def record(self, key: OffloadKey) -> bytes | None:
        """The stored bytes of ``key`` (``None`` when absent or still being written)."""
        return self._records.get(key)

    def in_flight_keys(self) -> set[OffloadKey]:
        """Keys that a job not yet polled reads or writes (not those it failed at once)."""
        return {
            key
            for pending in self._jobs
            if pending.job.kind is not JobKind.DELETE
            for i, key in enumerate(pending.job.keys)
            if i not in pending.fail and i not in pending.skip
        }

    def _check_batch(self, keys: Sequence[OffloadKey], slots: Sequence[int] | None) -> None:
        if slots is not None:
            check_batch(keys, slots, self.memory.num_slots)
        limit = self._caps.max_batch
        if limit and len(keys) > limit:
            raise ValueError(f"a job may carry at most max_batch={limit} keys, got {len(keys)}")

    def _open(self, kind: JobKind, keys: Sequence[OffloadKey], generation: int) -> tuple[Job, bool]:
        """A new job and whether it may run: on a closed tier it is already reported, each
        key ``"closed"`` (the one closed-tier rule of ``runtime``)."""
        self._stats[f"{kind.value}_jobs"] += 1
        with self._runtime.lock:
            job = self._runtime.open_job(kind, keys, generation)
            if not self._runtime.closed:
                return job, True
            self._stats["failed_keys"] += len(job.keys)
            self._runtime.finish(job)
            return job, False

    def _enqueue(
        self,
        job: Job,
        slots: Sequence[int],
        fail: dict[int, str],
        skip: set[int] | None = None,
        evicted: Sequence[OffloadKey] = (),
    ) -> int:
        job.evicted.extend(evicted)
        ready_at = job.started + self.latency_s
        self._jobs.append(
            _Pending(job, tuple(slots), ready_at, self.latency_polls, fail, skip or set())
        )
        return job.job_id

    def _fault(self, key: OffloadKey) -> str | None:
        return self.fail_all or self.fail_keys.get(key)

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._check_batch(keys, slots)
        job, runs = self._open(JobKind.PUT, keys, generation)
        if not runs:
            return job.job_id
        self._stats["puts"] += len(keys)
        ledger = self._ledger
        fail: dict[int, str] = {}
        skip: set[int] = set()
        evicted: list[OffloadKey] = []
        protected = set(keys)
        for i, key in enumerate(keys):
            status = ledger.get(key)
            if status is not None:
                if status.ref_cnt >= 0:
                    skip.add(i)  # records are immutable: already stored is a success
                else:
                    fail[i] = "busy"  # another job is writing it
                continue
            reason = self._fault(key)
            if reason is not None:
                fail[i] = reason
                continue
            victims = ledger.make_room(1, protected) if self.capacity_blocks else None
            if victims is None:
                fail[i] = "no_space"
                continue
            for victim in victims:
                del self._records[victim]
                evicted.append(victim)
            self._stats["evictions"] += len(victims)
            ledger.reserve([key], None)
        return self._enqueue(job, slots, fail, skip, evicted)

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._check_batch(keys, slots)
        job, runs = self._open(JobKind.GET, keys, generation)
        if not runs:
            return job.job_id
        self._stats["gets"] += len(keys)
        ledger = self._ledger
        fail: dict[int, str] = {}
        fresh: list[OffloadKey] = []
        statuses: list[BlockStatus] = []
        for i, key in enumerate(keys):
            status = ledger.get(key)
            if status is None or status.ref_cnt < 0:
                fail[i] = "missing"
                continue
            reason = self._fault(key)
            if reason is not None:
                fail[i] = reason
                continue
            fresh.append(key)
            statuses.append(status)
        ledger.pin(fresh, statuses)
        ledger.access(None, fresh, None)
        return self._enqueue(job, slots, fail)

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        self._check_batch(keys, None)
        job, runs = self._open(JobKind.DELETE, keys, generation)
        if not runs:
            return job.job_id
        ledger = self._ledger
        fail: dict[int, str] = {}
        for i, key in enumerate(keys):
            if ledger.remove_ready(key):
                del self._records[key]
                self._stats["deletes"] += 1
            else:
                fail[i] = "missing" if ledger.get(key) is None else "busy"
        return self._enqueue(job, (), fail)

    # ------------------------------------------------------------- completion
    def _complete(self, pending: _Pending, cancelled: bool = False) -> None:
        job, fail = pending.job, dict(pending.fail)
        ledger = self._ledger
        view = self.memory.slot_view
        nbytes = 0
        for i, key in enumerate(job.keys):
            if i in fail or i in pending.skip or job.kind is JobKind.DELETE:
                corrupt = job.kind is JobKind.GET and fail.get(i) == "corrupt"
                if corrupt and key in self._records and ledger.remove_ready(key):
                    del self._records[key]  # a corrupt record is never served again
                    self._stats["bad_records"] += 1
                continue
            if cancelled:
                fail[i] = CANCELLED
            if job.kind is JobKind.PUT:
                if ledger.get(key) is None:  # cannot happen: a pending record is never evicted
                    raise RuntimeError(f"put of {key.hex()} lost its pending record")
                if cancelled:
                    ledger.fail([key])
                    continue
                self._records[key] = bytes(view(pending.slots[i]))
                nbytes += self.memory.slot_bytes
                self._stats["stored"] += 1
                ledger.complete([key])
            else:
                if not cancelled:
                    view(pending.slots[i])[:] = self._records[key]
                    nbytes += self.memory.slot_bytes
                    self._stats["hits"] += 1
                ledger.unpin([key])
        self._stats["failed_keys"] += len(fail)
        self._stats["bytes_written" if job.kind is JobKind.PUT else "bytes_read"] += nbytes
        job.ok[:] = [i not in fail for i in range(len(job.keys))]
        job.reasons.update(fail)
        job.nbytes = nbytes
        with self._runtime.lock:
            self._runtime.finish(job)

    def poll(self) -> list[TierResult]:
        if not self.stuck:
            now = self._clock()
            waiting: list[_Pending] = []
            for pending in self._jobs:
                if pending.polls_left <= 0 and now >= pending.ready_at:
                    self._complete(pending)
                else:
                    pending.polls_left -= 1
                    waiting.append(pending)
            self._jobs = waiting
        return self._runtime.poll()

    def drain(self, timeout: float) -> bool:
        if self.stuck:
            return not self._jobs
        jobs, self._jobs = self._jobs, []
        for pending in jobs:
            self._complete(pending)
        return True

    # ------------------------------------------------------------------ extras
    def health(self) -> TierHealth:
        if self._runtime.closed:
            return TierHealth(ok=False, reason="closed")
        if self.fail_all:
            return TierHealth(ok=False, reason=self.fail_all)
        return TierHealth(ok=True)

    def tier_stats(self) -> TierStats:
        return TierStats.from_mapping(
            {
                **self._stats,
                "used_bytes": len(self._records) * self.memory.slot_bytes,
                "capacity_bytes": self.capacity_bytes,
                "records": len(self._records),
                "jobs_in_flight": len(self._jobs),
            }
        )

    def scan(self) -> Iterator[ScannedBlock]:
        size = self.memory.slot_bytes
        return iter([ScannedBlock(key, size, 0.0) for key in self._records])

    def close(self) -> None:
        if self._runtime.closed:
            return
        jobs, self._jobs = self._jobs, []
        for pending in jobs:
            self._complete(pending, cancelled=True)
        self._runtime.close(0)


__all__ = ["MemoryTier"]
