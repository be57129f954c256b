"""A real memory tier, slowed: each read or write job takes a latency plus its bytes over a
bandwidth, so the load-or-recompute decision can be tested and benchmarked against a tier
slower than prefill (and one that slows down mid-run: change the attributes any time)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.keys import OffloadKey
from kvoffload.tiers import MemoryTier, SlotMemory


class SlowMemoryTier(MemoryTier):
    """:class:`MemoryTier` whose jobs complete ``delay_s + nbytes / bytes_per_s`` after submit.

    ``delay_s`` and ``bytes_per_s`` (``0``: unlimited) apply to jobs submitted after they
    change. The data path is the memory tier's own; only completion is held back.
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
