"""How the disk tier's jobs become I/O tasks: runs of adjacent records, and how many run at once.

Why apart from the tier and the arena: the tier decides which records a job touches and the
arena does the I/O; between them sits one choice, measured on its own (``docs/benchmarks.md``,
"Put lanes"): how a job's records are cut into tasks (one vectored system call each) and how
many put tasks may be in flight together.
"""

from __future__ import annotations

import itertools

from kvoffload.keys import OffloadKey
from kvoffload.tiers.disk.index import IndexEntry

MAX_RUN = 256  # records per vectored call (two buffers each, under IOV_MAX = 1024)


class RunItem:
    """One key of a job: its index in the job, host slot, index entry and arena slot.

    A plain ``__slots__`` class, not a frozen dataclass: one is built per key of every job,
    and a frozen dataclass's ``__init__`` costs several times more.
    """

    __slots__ = ("arena", "entry", "index", "key", "slot")

    def __init__(self, index: int, key: OffloadKey, slot: int, entry: IndexEntry) -> None:
        self.index = index
        self.key = key
        self.slot = slot
        self.entry = entry
        self.arena = entry.slot


def chunk_runs(
    items: list[RunItem],
    threads: int,
    min_bytes: int,
    record_bytes: int,
    max_bytes: int | None = None,
) -> list[list[RunItem]]:
    """A job's keys as tasks: runs of adjacent arena slots, split across the threads.

    Adjacent slots go to the file in one vectored call. A job is cut into at most about
    ``threads`` tasks so one large batch still uses every thread, but no task is cut below
    ``min_bytes``: each task costs a thread hand-off, a lock round and its own system call,
    which small blocks cannot amortise (``docs/benchmarks.md`` has the measurements). With
    ``max_bytes``, no task holds more records than fit in it (at least one).
    """
    if not items:
        return []
    if any(a.arena >= b.arena for a, b in itertools.pairwise(items)):
        items = sorted(items, key=lambda it: it.arena)
    per_task = max(-(-len(items) // threads), -(-min_bytes // record_bytes))
    per_task = min(MAX_RUN, per_task)
    if max_bytes is not None:
        per_task = min(per_task, max(1, max_bytes // record_bytes))
    chunks: list[list[RunItem]] = [[items[0]]]
    last = chunks[0]
    for item in items[1:]:
        if item.arena == last[-1].arena + 1 and len(last) < per_task:
            last.append(item)
        else:
            last = [item]
            chunks.append(last)
    return chunks


# a put job is not split into tasks smaller than this (writes into one file serialise in
# the kernel anyway), nor a get job below the smaller size (reads of the page cache do run
# in parallel, and other jobs in flight keep the threads busy)
MIN_PUT_TASK_BYTES = 4 << 20
MIN_GET_TASK_BYTES = 1 << 20
# nor is a put task longer than this: its checksum pass reads the records just before its
# write copies them, and the bytes of the tasks in flight should still be in the CPU's cache
# then (docs/benchmarks.md, "Put lanes")
MAX_PUT_TASK_BYTES = 8 << 20
#: Records smaller than this store one put task at a time (see :func:`put_lane_width`).
SMALL_RECORD_BYTES = 128 << 10


def put_lane_width(durability: str, slot_bytes: int, io_threads: int) -> int:
    """How many put tasks may run at once.

    Buffered writes (``none``, ``rename``) into one arena serialise in the kernel, so puts
    gain from running side by side only where one task's checksum (which lets go of the GIL)
    overlaps another's write: two at a time for records whose checksum outweighs the Python
    each record costs (from about 128 KiB), one at a time below that, where threads would
    only contend for the GIL (``docs/benchmarks.md``, "Put lanes"). Under ``fsync`` the
    barriers wait on the device, so every thread may wait on one.
    """
    if durability == "fsync":
        return io_threads
    return min(io_threads, 1 if slot_bytes < SMALL_RECORD_BYTES else 2)


__all__ = [
    "MAX_PUT_TASK_BYTES",
    "MAX_RUN",
    "MIN_GET_TASK_BYTES",
    "MIN_PUT_TASK_BYTES",
    "SMALL_RECORD_BYTES",
    "RunItem",
    "chunk_runs",
    "put_lane_width",
]
