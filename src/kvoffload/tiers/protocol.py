"""What a driver of a tiered cache calls on its manager, named: :class:`TieredManager`.

Why: :class:`~kvoffload.offloader.KVOffloader` drives either a plain CPU manager or a
tiering manager. With a tiering manager it must advance the tiers every call (``step``),
look a request's prefix up as one (``lookup_prefix``, where the load-or-recompute plan is
made), read that plan and wait, bounded, for its reads (``request_plan``, ``wait``,
``note_overdue``). This protocol is that contract, so the facade checks it once and calls it,
instead of probing attributes and sleeping between polls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import LookupResult
from kvoffload.tiers.costs import LoadDecider, LoadPlan


@runtime_checkable
class TieredManager(Protocol):
    """A manager with secondary tiers behind its CPU tier (``TieringManager`` is one)."""

    #: Measured costs and the load-or-recompute decision (its block size and prefill speed
    #: are the driver's to set).
    costs: LoadDecider

    def step(self) -> int:
        """Submit queued promotions and reap completions; how many jobs completed."""
        ...

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], ctx: ReqContext | None = None
    ) -> list[LookupResult]:
        """Each key's result for a request's prefix; promotes the planned hit prefix."""
        ...

    def wait(self, timeout: float, ctx: ReqContext | None = None) -> bool:
        """Step until no tier work is pending (with ``ctx``: none of its promotions) or
        ``timeout`` seconds pass; True when none is left."""
        ...

    def request_plan(self, ctx: ReqContext) -> LoadPlan | None:
        """The load-or-recompute plan of ``ctx``'s last lookup (``None``: none was made)."""
        ...

    def note_overdue(self, ctx: ReqContext) -> int:
        """``ctx`` stopped waiting: its reads still in flight are lower bounds on their
        tiers' costs."""
        ...


__all__ = ["TieredManager"]
