"""The manager's vocabulary: result and spec types, statistics, and the OffloadingManager ABC.

Everything a driver (an engine's scheduler, the simulator, a tiering manager) needs to talk to
any tier, and nothing about how the CPU tier keeps its books (see :mod:`.cpu`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvoffload.context import ReqContext
from kvoffload.events import CPU_MEDIUM, OffloadingEvent
from kvoffload.keys import OffloadKey


class LookupResult(enum.Enum):
    """Outcome of looking up one key (vLLM's values)."""

    MISS = "miss"
    HIT = "hit"  # stored and readable
    HIT_PENDING = "hit_pending"  # stored, but its write has not completed yet
    RETRY = "retry"  # location unknown yet (async tiers); the CPU tier never returns it


@dataclass(frozen=True)
class RequestOffloadingContext:
    """What ``on_new_request`` returns (vLLM's shape): no per-request preferences.

    vLLM's carries an ``OffloadPolicy`` (offer a request's every block, or skip its prefix
    hits); nothing here read one (``prepare_store`` skips stored keys either way), so it is
    not modelled.
    """


@dataclass(slots=True)
class CPULoadStoreSpec:
    """CPU slot ids, co-indexed with the keys of the call that produced them."""

    block_ids: list[int]
    generation: int = 0

    @staticmethod
    def medium() -> str:
        return CPU_MEDIUM


@dataclass(slots=True)
class PrepareStoreOutput:
    """Result of ``prepare_store``: what to write, where, and what was evicted for it."""

    keys_to_store: list[OffloadKey]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass(frozen=True)
class OffloadingStats:
    """Cumulative counters since construction plus gauges at the time of the call."""

    num_blocks: int
    stored_blocks: int
    pending_blocks: int
    pinned_blocks: int
    evictable_blocks: int
    lookups: int
    hits: int
    hits_pending: int
    misses: int
    loads: int
    stores_prepared: int
    stores_completed: int
    stores_failed: int
    admission_rejects: int
    evictions: int
    failed_allocations: int
    stale_completions: int
    duplicate_completions: int
    resets: int
    generation: int
    policy: Mapping[str, float] = field(default_factory=dict)
    #: Slots of jobs that were in flight at a reset and have not completed yet: neither
    #: stored nor free (a write or read may still be using their bytes).
    held_blocks: int = 0
    #: Calls to ``switch_policy`` (live policy replacements).
    policy_switches: int = 0

    @property
    def fill_ratio(self) -> float:
        """Stored (ready or pending) blocks / capacity: how full the tier is."""
        return self.stored_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def pending_ratio(self) -> float:
        """Blocks being written / capacity."""
        return self.pending_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def pinned_ratio(self) -> float:
        """Blocks being read / capacity."""
        return self.pinned_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def hit_ratio(self) -> float:
        """HIT lookups / all lookups (HIT_PENDING counted apart)."""
        return self.hits / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        """Flat dict of every counter, gauge and ratio (policy gauges prefixed ``policy_``)."""
        out: dict[str, Any] = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "policy"
        }
        out.update(
            fill_ratio=self.fill_ratio,
            pending_ratio=self.pending_ratio,
            pinned_ratio=self.pinned_ratio,
            hit_ratio=self.hit_ratio,
        )
        out.update({f"policy_{k}": v for k, v in self.policy.items()})
        return out


class BlockAccesses(NamedTuple):
    """What an access of blocks did (``kvoffload.sim.drive.access_blocks``): each key's lookup
    result and the stores it made."""

    results: list[LookupResult]
    stored: int  # misses stored (their writes completed)
    evicted: int  # blocks evicted to make room
    failed: int  # misses that found no room (or that admission rejected, with filters on)


class OffloadingManager(ABC):
    """Scheduler-side contract of an offloading tier (vLLM's ``OffloadingManager`` shape).

    Every ``keys`` argument is any iterable of keys (a list, a tuple, a generator); a single
    key or a ``bytes``/``str`` value in its place is a ``TypeError``.
    """

    @abstractmethod
    def lookup(self, key: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        """Is ``key`` stored and readable? Pure: no recency or statistics of the policy change."""

    @abstractmethod
    def prepare_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        """Pin ready ``keys`` for reading until ``complete_load``; return their slots."""

    def touch(self, keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> None:  # noqa: B027
        """Record a use of ``keys`` (e.g. a GPU prefix-cache hit on them)."""

    def complete_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:  # noqa: B027
        """Unpin ``keys`` after their load finished."""

    @abstractmethod
    def prepare_store(
        self, keys: Iterable[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not stored yet (evicting if needed), or ``None``."""

    def complete_store(  # noqa: B027
        self, keys: Iterable[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        """Make stored ``keys`` readable, or drop them when their write failed."""

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        """A request starts; returns the tier's per-request preferences."""
        return RequestOffloadingContext()

    def on_request_finished(self, ctx: ReqContext) -> None:  # noqa: B027
        """The request makes no more prepare calls (completions may still arrive)."""

    def take_events(self) -> list[OffloadingEvent]:
        """Drain the events recorded since the last call."""
        return []

    def reset_cache(self) -> None:  # noqa: B027
        """Drop every block."""

    def get_stats(self) -> OffloadingStats | None:
        """Counters and gauges, or ``None`` when the tier keeps none."""
        return None

    def has_pending_work(self) -> bool:
        """Whether a job this tier handed out (a load or a store) has not completed yet."""
        return False

    def shutdown(self) -> None:  # noqa: B027
        """Release resources; later calls raise ``RuntimeError``."""


__all__ = [
    "BlockAccesses",
    "CPULoadStoreSpec",
    "LookupResult",
    "OffloadingManager",
    "OffloadingStats",
    "PrepareStoreOutput",
    "RequestOffloadingContext",
]
