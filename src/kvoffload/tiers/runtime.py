"""The one job machinery under every tier: job table, done queue, ``poll``, ``drain``, close.

Why one: a tier's own work is its I/O (a file, a server, a dict). Reporting each job exactly
once, waiting for the ones in flight with a deadline, and answering a job submitted after
``close`` are the same for every medium, so they live here and a tier keeps only its I/O.
The closed-tier rule is one: a job submitted after ``close`` comes back from ``poll`` with a
``"closed"`` verdict for every key (never an exception: a scheduler that races a shutdown
sees failed keys, which are misses, and moves on).

Threads are optional: a tier that runs its I/O on threads gives ``io_threads`` and submits
tasks with :meth:`TierRuntime.spawn`; one that completes jobs itself (the in-memory tier,
which finishes jobs when polled, on its own clock) passes ``0`` and calls
:meth:`TierRuntime.finish` directly.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import JobKind, TierResult

logger = logging.getLogger(__name__)

#: The verdict of every key of a job submitted after ``close``.
CLOSED = "closed"
#: The verdict of a key whose task was still queued when the tier closed.
CANCELLED = "cancelled"


@dataclass
class Job:
    """One submitted batch while it runs: per-key verdicts filled in by its tasks.

    ``remaining`` counts the tasks not yet done; the job is reported when it reaches 0.
    ``on_finish`` runs (with the runtime's lock held) just before the job is reported.
    """

    job_id: int
    kind: JobKind
    keys: tuple[OffloadKey, ...]
    generation: int
    ok: list[bool]
    started: float
    reasons: dict[int, str] = field(default_factory=dict)
    remaining: int = 0
    nbytes: int = 0
    evicted: list[OffloadKey] = field(default_factory=list)
    on_finish: Callable[[Job], None] | None = None

    def fail(self, index: int, reason: str) -> None:
        self.ok[index] = False
        self.reasons[index] = reason

    def fail_all(self, reason: str) -> None:
        """Fail every key that has no verdict yet (a key already failed keeps its reason)."""
        for i in range(len(self.keys)):
            if not self.ok[i] and i not in self.reasons:
                self.reasons[i] = reason

    def result(self, now: float) -> TierResult:
        """The job as reported, its ``seconds`` counted up to ``now`` (its clock's time)."""
        return TierResult(
            job_id=self.job_id,
            kind=self.kind,
            keys=self.keys,
            ok=tuple(self.ok),
            generation=self.generation,
            nbytes=self.nbytes,
            seconds=max(0.0, now - self.started),
            reasons=dict(self.reasons),
            evicted=tuple(self.evicted),
        )


class Lane:
    """Tasks of one kind that run at most ``width`` at a time on a runtime's pool.

    Why: some I/O gains nothing from running side by side (buffered writes into one file
    serialise in the kernel), and extra threads waiting on each other cost CPU; a lane keeps
    such tasks to ``width`` threads, leaving the others to the rest of the tier's work.
    """

    __slots__ = ("queue", "running", "width")

    def __init__(self, width: int) -> None:
        self.width = width
        self.running = 0
        self.queue: deque[tuple[Job, Callable[..., None], tuple[Any, ...]]] = deque()


class TierRuntime:
    """Job ids, the jobs in flight, the done queue and an optional I/O thread pool.

    Every method that touches jobs expects :attr:`lock` held (:meth:`spawn` too), except
    :meth:`poll`, :meth:`drain` and :meth:`close`, which take it themselves.
    """

    def __init__(
        self,
        io_threads: int = 0,
        thread_name: str = "kvoff-tier",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.lock = threading.Lock()
        self._clock = clock
        self._idle = threading.Condition(self.lock)
        self._ids = itertools.count(1)
        self._jobs: dict[int, Job] = {}
        self._done: deque[TierResult] = deque()
        self.closed = False
        self._pool = (
            ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix=thread_name)
            if io_threads
            else None
        )

    # ----------------------------------------------------------------- jobs (lock held)

    def open_job(self, kind: JobKind, keys: Sequence[OffloadKey], generation: int) -> Job:
        """A new job in the table; under the closed rule it is already failed."""
        keys_t = tuple(keys)
        job = Job(
            job_id=next(self._ids),
            kind=kind,
            keys=keys_t,
            generation=generation,
            ok=[False] * len(keys_t),
            started=self._clock(),
        )
        self._jobs[job.job_id] = job
        if self.closed:
            job.fail_all(CLOSED)
        return job

    def finish(self, job: Job, tasks_done: int = 0) -> int:
        """Count ``tasks_done`` more tasks of ``job`` as done; report it once none remain."""
        job.remaining -= tasks_done
        if job.remaining == 0 and self._jobs.pop(job.job_id, None) is not None:
            if job.on_finish is not None:
                job.on_finish(job)
            self._done.append(job.result(self._clock()))
            if not self._jobs:
                self._idle.notify_all()
        return job.job_id

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    # ----------------------------------------------------------------- threads

    def spawn(
        self, job: Job, task: Callable[..., None], *args: Any, lane: Lane | None = None
    ) -> None:
        """Run ``task(*args)`` on the pool as one more task of ``job`` (lock held).

        The task itself calls :meth:`finish` (lock held) when done. A task that raises is a
        bug in the tier; the job is still reported once, its open keys failed as ``io_error``.
        With ``lane``, the task waits its turn in the lane's queue: at most ``lane.width`` of
        its tasks run at a time, in the order spawned.
        """
        if self._pool is None:
            raise RuntimeError("this runtime has no I/O threads (io_threads=0)")
        job.remaining += 1
        if lane is None:
            self._pool.submit(self._run, job, task, args)
            return
        lane.queue.append((job, task, args))
        if lane.running < lane.width:
            lane.running += 1
            self._pool.submit(self._run_lane, lane)

    def _run(self, job: Job, task: Callable[..., None], args: tuple[Any, ...]) -> None:
        try:
            task(*args)
        except Exception:
            logger.exception("a tier task of job %d raised", job.job_id)
            with self.lock:
                job.fail_all("io_error")
                self.finish(job, 1)

    def _run_lane(self, lane: Lane) -> None:
        """Run the lane's queued tasks one after another until none is left (one thread)."""
        while True:
            with self.lock:
                if not lane.queue:
                    lane.running -= 1
                    return
                job, task, args = lane.queue.popleft()
            self._run(job, task, args)

    # ----------------------------------------------------------------- the contract's half

    def poll(self) -> list[TierResult]:
        """Every job reported since the last call, each exactly once."""
        with self.lock:
            out = list(self._done)
            self._done.clear()
            return out

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no job is in flight; True when none is."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        deadline = time.monotonic() + max(0.0, float(timeout))
        with self._idle:
            while self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def close(self, timeout: float = 30.0) -> bool:
        """Mark closed (tasks not started see it and cancel), wait for running tasks, stop
        the threads; True the first time, False when already closed."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
        self.drain(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        return True


def check_batch(
    keys: Sequence[OffloadKey], slots: Sequence[int], num_slots: int
) -> tuple[tuple[OffloadKey, ...], tuple[int, ...]]:
    """``keys`` and ``slots`` as tuples, paired one to one, every slot an int in range."""
    if isinstance(keys, (bytes, str)) or isinstance(slots, (bytes, str)):
        raise TypeError("keys and slots must be sequences (a single key is [key])")
    keys_t, slots_t = tuple(keys), tuple(slots)
    if len(keys_t) != len(slots_t):
        raise ValueError(f"keys and slots must pair up, got {len(keys_t)} and {len(slots_t)}")
    for slot in slots_t:
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise TypeError(f"slots must be ints, got {type(slot).__name__}")
        if not 0 <= slot < num_slots:
            raise ValueError(f"slot must be in [0, {num_slots}), got {slot}")
    return keys_t, slots_t


class FailureLog:
    """Failed keys counted by reason, with a rate-limited warning for the reasons that are
    not the caller's or the job's own business (those in ``quiet``; ``None``: all)."""

    def __init__(self, quiet: frozenset[str] | None = None, interval_s: float = math.inf) -> None:
        self.counts: dict[str, int] = {}
        self._quiet = quiet
        self._interval_s = interval_s
        self._unwarned: dict[str, int] = {}  # since the last warning, by reason
        self._warned_at = -math.inf

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_reason(self, prefix: str) -> dict[str, float]:
        """The counts as stats entries, ``<prefix><reason>``."""
        return {prefix + reason: float(n) for reason, n in self.counts.items()}

    def add(self, reason: str) -> str | None:
        """Count one failure; when a warning is due, the counts since the last one as text
        (``"no_space 3, io_error 1"``), else ``None``."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if self._quiet is None or reason in self._quiet:
            return None
        self._unwarned[reason] = self._unwarned.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._warned_at < self._interval_s:
            return None
        self._warned_at = now
        text = ", ".join(f"{why} {n}" for why, n in sorted(self._unwarned.items()))
        self._unwarned.clear()
        return text


__all__ = ["CANCELLED", "CLOSED", "FailureLog", "Job", "TierRuntime", "check_batch"]
