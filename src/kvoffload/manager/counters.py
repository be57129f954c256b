"""The manager's cumulative counters, all in one object."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class Counters:
    """Every cumulative counter of a manager since construction (never reset).

    One slotted object: the hot path increments attributes (``counters.hits += 1``) and
    ``get_stats`` reads them all; a driver that bypasses the public calls (the simulator's
    blocks mode) counts here exactly what those calls would have counted.
    """

    misses: int = 0
    hits: int = 0
    hits_pending: int = 0
    loads: int = 0
    stores_prepared: int = 0
    stores_completed: int = 0
    stores_failed: int = 0
    admission_rejects: int = 0
    evictions: int = 0
    failed_allocations: int = 0
    stale_completions: int = 0
    duplicate_completions: int = 0
    resets: int = 0
    policy_switches: int = 0

    @property
    def lookups(self) -> int:
        """Every lookup is a hit, a pending hit or a miss: the three are counted, not this
        (one increment per lookup instead of two on the hottest call)."""
        return self.misses + self.hits + self.hits_pending

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, ``lookups`` included."""
        out = {"lookups": self.lookups}
        out.update((f.name, getattr(self, f.name)) for f in fields(self))
        return out


__all__ = ["Counters"]
