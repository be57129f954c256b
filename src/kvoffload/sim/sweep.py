"""Policies x capacities replays (and the bounds beside them) in parallel worker processes.

Each worker receives the trace once (at start-up) and then runs whole replays, so the only
per-task traffic is a small spec out and a result back. Results come back in a fixed order
(capacity-major, policies in the order given) whatever order the workers finish in.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from kvoffload.sim.bounds import Bounds, TraceBounds
from kvoffload.sim.capacity import Capacity
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec, ReplayOptions, ReplayResult, replay
from kvoffload.sim.tier_config import TieredCapacity
from kvoffload.sim.tiered import tiered_replay

_WORKER_TRACE: Trace | None = None
_WORKER_BOUNDS: TraceBounds | None = None


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE, _WORKER_BOUNDS
    # Ctrl-C reaches the whole process group. A worker that raised KeyboardInterrupt would
    # only hand it back as its task's result and carry on with the next task; the parent
    # stops the workers instead (see _stop_workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER_TRACE, _WORKER_BOUNDS = trace, None


def replay_at(
    trace: Trace, policy: PolicySpec, capacity: Capacity, options: ReplayOptions
) -> ReplayResult:
    """One grid cell: a single-tier replay, or a multi-tier one for a :class:`TieredCapacity`.

    An exception it raises carries the cell (:func:`failed_cell`), across worker processes
    too, so a caller can tell which policy broke the replay.
    """
    try:
        if isinstance(capacity, TieredCapacity) and capacity.config is not None:
            return tiered_replay(trace, capacity.config, policy, options)
        return replay(trace, capacity.blocks, policy, options, capacity.label)
    except Exception as exc:
        # An attribute, not a wrapper: the exception keeps its type (and pickles with it);
        # an exception type without a __dict__ just has no cell to tell.
        with contextlib.suppress(AttributeError):
            exc.kvoffload_replay_cell = (policy, capacity.label)  # type: ignore[attr-defined]
        raise


def failed_cell(exc: BaseException) -> tuple[PolicySpec, str] | None:
    """``(policy, capacity label)`` of the replay that raised ``exc``, if a replay did."""
    cell = getattr(exc, "kvoffload_replay_cell", None)
    if isinstance(cell, tuple) and len(cell) == 2 and isinstance(cell[0], PolicySpec):
        return cell[0], str(cell[1])
    return None


def _worker_replay(policy: PolicySpec, capacity: Capacity, options: ReplayOptions) -> ReplayResult:
    assert _WORKER_TRACE is not None, "worker started without a trace"
    return replay_at(_WORKER_TRACE, policy, capacity, options)


def _worker_bounds(capacity: Capacity) -> Bounds:
    global _WORKER_BOUNDS
    assert _WORKER_TRACE is not None, "worker started without a trace"
    if _WORKER_BOUNDS is None:
        _WORKER_BOUNDS = TraceBounds(_WORKER_TRACE)
    return _WORKER_BOUNDS.at(capacity.blocks)


@dataclass
class SweepResult:
    """Replay results (capacity-major) and the bounds at each capacity (same order).

    A sweep cut short (:class:`SweepInterrupted`) holds only the tasks that finished, in the
    same order, with ``partial`` set and ``tasks_total`` the tasks the whole grid had.
    """

    results: list[ReplayResult]
    bounds: list[Bounds] = field(default_factory=list)
    partial: bool = False
    tasks_total: int = 0

    @property
    def tasks_done(self) -> int:
        return len(self.results) + len(self.bounds)


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep; :attr:`partial` holds what finished before it (a
    ``KeyboardInterrupt``, so a caller that ignores partial results stops as before)."""

    def __init__(self, partial: SweepResult) -> None:
        super().__init__(f"{partial.tasks_done} of {partial.tasks_total} tasks finished")
        self.partial = partial


ProgressCallback = Callable[[str], None]


def default_workers(tasks: int) -> int:
    """One worker per CPU this process may use, never more than there are tasks."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, tasks))


def _pool_context() -> multiprocessing.context.BaseContext:
    # fork shares the parent's memory (no trace pickling, no re-imports); elsewhere fork is
    # unsafe or unavailable, so use the platform default.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def run_sweep(
    trace: Trace,
    policies: Sequence[PolicySpec],
    capacities: Sequence[Capacity],
    options: ReplayOptions,
    with_bounds: bool = True,
    workers: int | None = None,
    on_task_done: ProgressCallback | None = None,
    on_started: Callable[[int], None] | None = None,
) -> SweepResult:
    """Replay every policy at every capacity (plus the bounds); see the module docstring.

    ``on_started(total_tasks)`` is called once the workers exist (start a progress display
    there: forking after a display thread starts is unsafe), ``on_task_done(label)`` after
    each task.
    """
    replay_tasks = [(p, c) for c in capacities for p in policies]
    bound_tasks = list(capacities) if with_bounds else []
    total = len(replay_tasks) + len(bound_tasks)
    workers = default_workers(total) if workers is None else max(1, workers)
    done = on_task_done or (lambda label: None)
    if workers == 1 or total == 1:
        return _run_inline(trace, replay_tasks, bound_tasks, options, done, on_started, total)
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_pool_context(),
        initializer=_init_worker,
        initargs=(trace,),
    )
    try:
        # Bounds first: they are the longest single tasks.
        bound_futures = [pool.submit(_worker_bounds, c) for c in bound_tasks]
        replay_futures = [pool.submit(_worker_replay, p, c, options) for p, c in replay_tasks]
        if on_started is not None:
            on_started(total)
        for bound_future, capacity in zip(bound_futures, bound_tasks, strict=True):
            bound_future.add_done_callback(_notify(done, f"bounds @ {capacity.label}"))
        for replay_future, (policy, capacity) in zip(replay_futures, replay_tasks, strict=True):
            replay_future.add_done_callback(_notify(done, f"{policy.label} @ {capacity.label}"))
        bounds = [f.result() for f in bound_futures]
        results = [f.result() for f in replay_futures]
    except KeyboardInterrupt as exc:
        # Keep what finished (a long sweep's finished replays are worth writing), then stop.
        partial = SweepResult(
            [f.result() for f in replay_futures if _succeeded(f)],
            [f.result() for f in bound_futures if _succeeded(f)],
            partial=True,
            tasks_total=total,
        )
        _stop_workers(pool, before)
        raise SweepInterrupted(partial) from exc
    except BaseException:
        # Fail fast (an error): drop queued tasks and stop running ones now rather than wait
        # for every running replay to finish.
        _stop_workers(pool, before)
        raise
    pool.shutdown(wait=True)
    return SweepResult(results, bounds, tasks_total=total)


def _stop_workers(pool: ProcessPoolExecutor, before: set[BaseProcess]) -> None:
    """Cancel what is queued and terminate the pool's processes (those started after ``before``)."""
    pool.shutdown(wait=False, cancel_futures=True)
    workers = [p for p in multiprocessing.active_children() if p not in before]
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=1.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=1.0)


def _succeeded(future: Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


def _notify(done: ProgressCallback, label: str) -> Callable[[Future[Any]], None]:
    def callback(future: Future[Any]) -> None:
        if not future.cancelled() and future.exception() is None:
            done(label)

    return callback


def _run_inline(
    trace: Trace,
    replay_tasks: list[tuple[PolicySpec, Capacity]],
    bound_tasks: list[Capacity],
    options: ReplayOptions,
    done: ProgressCallback,
    on_started: Callable[[int], None] | None,
    total: int,
) -> SweepResult:
    if on_started is not None:
        on_started(total)
    bounds: list[Bounds] = []
    results: list[ReplayResult] = []
    try:
        if bound_tasks:
            trace_bounds = TraceBounds(trace)
            for capacity in bound_tasks:
                bounds.append(trace_bounds.at(capacity.blocks))
                done(f"bounds @ {capacity.label}")
        for policy, capacity in replay_tasks:
            results.append(replay_at(trace, policy, capacity, options))
            done(f"{policy.label} @ {capacity.label}")
    except KeyboardInterrupt as exc:
        partial = SweepResult(results, bounds, partial=True, tasks_total=total)
        raise SweepInterrupted(partial) from exc
    return SweepResult(results, bounds, tasks_total=total)


__all__ = [
    "SweepInterrupted",
    "SweepResult",
    "default_workers",
    "failed_cell",
    "replay_at",
    "run_sweep",
]
