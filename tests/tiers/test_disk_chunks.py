"""How the disk tier cuts a job into tasks: runs of adjacent slots, spread over the threads,
no task under the minimum nor (for puts) over the maximum."""

from __future__ import annotations

from kvoffload.policies import BlockStatus
from kvoffload.tiers.disk.index import IndexEntry
from kvoffload.tiers.disk.tasks import RunItem, chunk_runs

MIB = 1 << 20


def _items(slots: list[int]) -> list[RunItem]:
    entries = [IndexEntry(slot, 0, BlockStatus(i)) for i, slot in enumerate(slots)]
    return [RunItem(i, b"k%d" % i, i, entry) for i, entry in enumerate(entries)]


def _sizes(chunks: list[list[RunItem]]) -> list[int]:
    return [len(c) for c in chunks]


def test_a_large_job_is_spread_over_the_threads_in_runs_of_adjacent_slots() -> None:
    chunks = chunk_runs(_items(list(range(16))), 4, 4 * MIB, 2 * MIB)
    assert _sizes(chunks) == [4, 4, 4, 4]
    assert [it.arena for c in chunks for it in c] == list(range(16))


def test_no_task_is_cut_below_the_minimum_and_gaps_end_a_run() -> None:
    assert _sizes(chunk_runs(_items(list(range(16))), 4, 4 * MIB, 64 << 10)) == [16]
    assert _sizes(chunk_runs(_items([5, 6, 7, 20, 21]), 4, 4 * MIB, 64 << 10)) == [3, 2]
    assert [it.arena for it in chunk_runs(_items([3, 1, 2]), 1, 0, 1)[0]] == [1, 2, 3]


def test_a_maximum_bounds_a_task_but_never_below_one_record() -> None:
    assert _sizes(chunk_runs(_items(list(range(8))), 2, 4 * MIB, 6 * MIB, 8 * MIB)) == [1] * 8
    assert _sizes(chunk_runs(_items(list(range(16))), 1, 0, 2 * MIB, 8 * MIB)) == [4] * 4
    assert _sizes(chunk_runs(_items(list(range(4))), 1, 0, 16 * MIB, 8 * MIB)) == [1] * 4
