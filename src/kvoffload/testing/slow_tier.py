"""A real memory tier, slowed: each read or write job takes a latency plus its bytes over a
bandwidth, so the load-or-recompute decision can be tested and benchmarked against a tier
slower than prefill (and one that slows down mid-run: change the attributes any time)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kvoffload.keys import OffloadKey
from kvoffload.tiers import MemoryTier, SlotMemory


class SlowMemoryTier(MemoryTier):
    """:class:`MemoryTier` whose jobs complete ``delay_s + nbytes / bytes_per_s`` after submit.

    ``delay_s`` and ``bytes_per_s`` (``0``: unlimited) apply to jobs submitted after they
    change. The data path is the memory tier's own; only completion is held back, by
    :meth:`drain` too: on the real clock it blocks until its jobs are due (or ``timeout``),
    as a slow medium's drain does, where the memory tier's completes them at once. (On an
    injected clock it keeps the memory tier's drain: a test's time does not pass by itself.)
    """

    def __init__(
        self,
        memory: SlotMemory,
        capacity_bytes: int,
        *args: Any,
        delay_s: float = 0.0,
        bytes_per_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(memory, capacity_bytes, *args, **kwargs)
        self.delay_s = float(delay_s)
        self.bytes_per_s = float(bytes_per_s)

    def _slow(self, n: int) -> None:
        extra = n * self.memory.slot_bytes / self.bytes_per_s if self.bytes_per_s > 0 else 0.0
        self.latency_s = self.delay_s + extra

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._slow(len(keys))
        return super().submit_get(keys, slots, generation)

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._slow(len(keys))
        return super().submit_put(keys, slots, generation)

    def drain(self, timeout: float) -> bool:
        if self.stuck or self._clock is not time.monotonic:
            return super().drain(timeout)
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            now = time.monotonic()
            due = [p for p in self._jobs if p.ready_at <= now]
            if due:
                self._jobs = [p for p in self._jobs if p.ready_at > now]
                for pending in due:
                    self._complete(pending)
            if not self._jobs:
                return True
            if now >= end:
                return False
            time.sleep(min(min(p.ready_at for p in self._jobs), end) - now)
