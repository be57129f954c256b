"""The tier runtime's lanes: at most ``width`` tasks of a lane at once, in order, each job
reported once; and the disk tier's choice of put lane width."""

from __future__ import annotations

import threading
import time

import pytest

from kvoffload.tiers.base import JobKind
from kvoffload.tiers.disk.tasks import SMALL_RECORD_BYTES, put_lane_width
from kvoffload.tiers.runtime import Job, Lane, TierRuntime


def _spawn_tasks(
    runtime: TierRuntime, lane: Lane | None, n: int, task_s: float
) -> tuple[list[int], list[int]]:
    """``n`` one-task jobs whose tasks sleep ``task_s``; the order the tasks ran in and the
    most that ran at once (filled in as they run)."""
    order: list[int] = []
    peak = [0, 0]  # now running, most at once
    guard = threading.Lock()

    def task(job: Job, i: int) -> None:
        with guard:
            peak[0] += 1
            peak[1] = max(peak[1], peak[0])
            order.append(i)
        time.sleep(task_s)
        with guard:
            peak[0] -= 1
        with runtime.lock:
            job.ok[0] = True
            runtime.finish(job, 1)

    with runtime.lock:
        for i in range(n):
            job = runtime.open_job(JobKind.PUT, [b"k%d" % i], 0)
            runtime.spawn(job, task, job, i, lane=lane)
            runtime.finish(job)
    return order, peak


@pytest.mark.parametrize("width", [1, 2, 3])
def test_a_lane_runs_at_most_width_tasks_at_once_in_the_order_spawned(width: int) -> None:
    runtime = TierRuntime(io_threads=4)
    lane = Lane(width)
    order, peak = _spawn_tasks(runtime, lane, 12, 0.01)
    assert runtime.drain(10)
    results = runtime.poll()
    assert len(results) == 12 and all(r.all_ok for r in results)
    assert peak[1] == width  # never more, and the lane does use its width
    if width == 1:
        assert order == list(range(12))
    assert sorted(order) == list(range(12))
    assert lane.running == 0 and not lane.queue
    runtime.close()


def test_without_a_lane_every_thread_may_run_a_task() -> None:
    runtime = TierRuntime(io_threads=4)
    _order, peak = _spawn_tasks(runtime, None, 8, 0.05)
    assert runtime.drain(10)
    assert peak[1] == 4
    runtime.close()


def test_a_lane_task_that_raises_fails_its_job_and_the_lane_goes_on() -> None:
    runtime = TierRuntime(io_threads=2)
    lane = Lane(1)
    ran = []

    def bad(job: Job) -> None:
        raise RuntimeError("a bug in a tier")

    def good(job: Job) -> None:
        ran.append(job.job_id)
        with runtime.lock:
            job.ok[0] = True
            runtime.finish(job, 1)

    with runtime.lock:
        jobs = [runtime.open_job(JobKind.PUT, [b"k"], 0) for _ in range(3)]
        for job, task in zip(jobs, (good, bad, good), strict=True):
            runtime.spawn(job, task, job, lane=lane)
            runtime.finish(job)
    assert runtime.drain(10)
    results = {r.job_id: r for r in runtime.poll()}
    assert [results[j.job_id].all_ok for j in jobs] == [True, False, True]
    assert results[jobs[1].job_id].reasons == {0: "io_error"}
    assert ran == [jobs[0].job_id, jobs[2].job_id]
    runtime.close()


def test_put_lane_width_follows_durability_and_record_size() -> None:
    assert put_lane_width("fsync", 64 << 10, 4) == 4
    assert put_lane_width("rename", SMALL_RECORD_BYTES - 1, 4) == 1
    assert put_lane_width("none", SMALL_RECORD_BYTES, 4) == 2
    assert put_lane_width("rename", 2 << 20, 1) == 1
