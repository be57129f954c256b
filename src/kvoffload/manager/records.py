"""Per-request bookkeeping, kept in the request's ``ReqContext`` (no global map to leak)."""

from __future__ import annotations

from kvoffload.keys import OffloadKey


class StaleJobs:
    """One request's jobs that were in flight when generation ``generation`` ended."""

    __slots__ = ("generation", "loads", "stores")

    def __init__(
        self, generation: int, stores: set[OffloadKey], loads: dict[OffloadKey, int]
    ) -> None:
        self.generation = generation
        self.stores = stores
        self.loads = loads

    def __bool__(self) -> bool:
        return bool(self.stores or self.loads)


class RequestRecord:
    """What one request has in flight, and which keys it has already accessed.

    ``stores`` / ``loads`` hold the jobs prepared in ``generation``. When the cache is reset
    while jobs are in flight they move to ``stale`` (oldest first), so that their completions
    are recognised, free the slots those jobs held, and change nothing else.
    """

    __slots__ = ("generation", "loads", "stale", "stores", "touched")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.touched: set[OffloadKey] = set()
        self.stores: set[OffloadKey] = set()
        self.loads: dict[OffloadKey, int] = {}  # key -> loads in flight
        self.stale: list[StaleJobs] = []

    def start_generation(self, generation: int) -> None:
        """The cache was reset since this request's last call."""
        if self.stores or self.loads:
            self.stale.append(StaleJobs(self.generation, self.stores, self.loads))
            self.stores = set()
            self.loads = {}
        self.generation = generation
        self.touched.clear()

    def stale_store_done(self, key: OffloadKey) -> int | None:
        """The generation of the oldest stale store of ``key`` (now done), or ``None``."""
        for jobs in self.stale:
            if key in jobs.stores:
                jobs.stores.discard(key)
                return self._drop_if_empty(jobs)
        return None

    def stale_load_done(self, key: OffloadKey) -> int | None:
        """The generation of the oldest stale load of ``key`` (now done), or ``None``."""
        for jobs in self.stale:
            count = jobs.loads.get(key)
            if count is not None:
                if count == 1:
                    del jobs.loads[key]
                else:
                    jobs.loads[key] = count - 1
                return self._drop_if_empty(jobs)
        return None

    def has_stale_store(self, key: OffloadKey) -> bool:
        return any(key in jobs.stores for jobs in self.stale)

    def has_stale_load(self, key: OffloadKey) -> bool:
        return any(key in jobs.loads for jobs in self.stale)

    def _drop_if_empty(self, jobs: StaleJobs) -> int:
        if not jobs:
            self.stale.remove(jobs)
        return jobs.generation


__all__ = ["RequestRecord", "StaleJobs"]
