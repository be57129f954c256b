"""Which earlier, unfinished transfer jobs a new job must wait for.

Jobs run concurrently (a thread pool, or separate store and load streams), yet a load must
never read a slot before an earlier store to it finished, a store must not overwrite a slot
an earlier load is still reading, and the same holds for device blocks. The tracker records,
per resource (a slot or a device block), its last unfinished writer and the unfinished
readers since, and returns the read-after-write, write-after-read and write-after-write
dependencies of each new job. Loads of the same slot still run in parallel.

Not thread-safe: the worker calls it under its own lock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

J = TypeVar("J", bound=Hashable)
R = Hashable


class HazardTracker(Generic[J]):
    """Dependencies between jobs that read and write shared resources."""

    def __init__(self) -> None:
        self._writer: dict[R, J] = {}
        self._readers: dict[R, set[J]] = {}
        self._resources: dict[J, tuple[list[R], list[R]]] = {}

    def add(self, job: J, reads: Iterable[R], writes: Iterable[R]) -> set[J]:
        """Register ``job``; return the unfinished jobs it must wait for."""
        if job in self._resources:
            raise ValueError(f"job {job!r} is already tracked")
        reads, writes = list(reads), list(writes)
        deps: set[J] = set()
        writer, readers = self._writer, self._readers
        for r in reads:
            w = writer.get(r)
            if w is not None:
                deps.add(w)
        for r in writes:
            w = writer.get(r)
            if w is not None:
                deps.add(w)
            earlier = readers.pop(r, None)
            if earlier:
                deps.update(earlier)
        for r in reads:
            readers.setdefault(r, set()).add(job)
        for r in writes:
            writer[r] = job
        deps.discard(job)
        self._resources[job] = (reads, writes)
        return deps

    def remove(self, job: J) -> None:
        """``job`` finished (or failed): nobody needs to wait for it any more."""
        reads, writes = self._resources.pop(job, ([], []))
        for r in reads:
            readers = self._readers.get(r)
            if readers is not None:
                readers.discard(job)
                if not readers:
                    del self._readers[r]
        for r in writes:
            if self._writer.get(r) == job:
                del self._writer[r]

    def __len__(self) -> int:
        """Unfinished jobs being tracked."""
        return len(self._resources)

    @property
    def idle(self) -> bool:
        """No job and no resource is tracked (nothing leaked)."""
        return not (self._resources or self._writer or self._readers)


__all__ = ["HazardTracker"]
