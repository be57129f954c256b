"""A tiering manager's bookkeeping: its jobs, each secondary tier's state, per-request state.

Why apart: the manager's lookup, write and completion paths all read and write these; the
records themselves carry no behaviour beyond the in-flight bound.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvoffload.admission import AdmissionFilter, StoreAfterNOffers
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import JobKind
from kvoffload.tiers.breaker import CircuitBreaker
from kvoffload.tiers.costs import LoadPlan, TierCosts
from kvoffload.tiers.settings import SecondaryTier, WritePolicy


@dataclass
class TierJobState:
    kind: JobKind
    keys: tuple[OffloadKey, ...]
    ctx: ReqContext
    generation: int
    nbytes: int
    purpose: str  # "promote", "write", "fill", "write_back"
    slots: tuple[int, ...] = ()  # a write-back's held victim slots (released on completion)
    submitted: float = 0.0  # time.monotonic() at submit: a read's wait as the request sees it
    overdue: bool = False  # a request stopped waiting for it (its age was observed then)


@dataclass(slots=True)
class RequestState:
    """Per-request tiering state kept in the request's ``ReqContext``."""

    retries: dict[OffloadKey, int] = field(default_factory=dict)
    # this pass's CPU-resident prefix, in order
    seen: dict[OffloadKey, None] = field(default_factory=dict)
    plan: LoadPlan | None = None  # the last lookup_prefix's load-or-recompute plan


def request_state(ctx: ReqContext) -> RequestState:
    state = ctx.get_state(RequestState)
    if state is None:
        state = RequestState()
        ctx.set_state(state)
    return state


TIER_COUNTERS = (
    "lookups",
    "hits",
    "unknown",
    "promotions",
    "promotion_failures",
    "blocks_written",
    "write_failures",
    "already_stored",
    "bytes_read",
    "bytes_written",
    "read_seconds",
    "write_seconds",
    "stale_completions",
    "tier_evictions",
)


class TierState:
    """One secondary tier's runtime state."""

    def __init__(self, spec: SecondaryTier, label: str, clock: Callable[[], float]) -> None:
        self.spec = spec
        self.tier = spec.tier
        self.label = label
        self.breaker = CircuitBreaker(
            spec.breaker_threshold, spec.breaker_backoff_s, spec.breaker_max_backoff_s, clock
        )
        self.policy = WritePolicy(spec.write_policy)
        self.admission: AdmissionFilter | None = None
        if self.policy is WritePolicy.SELECTIVE:
            self.admission = (  # not `or`: an empty offer table has len() 0
                spec.admission
                if spec.admission is not None
                else StoreAfterNOffers(max(spec.store_threshold, 1))
            )
        self.max_batch = spec.tier.capabilities.max_batch
        self.jobs: dict[int, TierJobState] = {}
        self.inflight_bytes = 0
        self.put_keys: set[OffloadKey] = set()  # keys with a put in flight here
        self.queue: list[tuple[OffloadKey, int, ReqContext]] = []  # promotions not submitted
        self.negative: OrderedDict[OffloadKey, float] = OrderedDict()  # failed read -> expiry
        self.write_backs = 0  # evicted blocks whose write here is in flight
        self.counters: dict[str, float] = dict.fromkeys(TIER_COUNTERS, 0)
        self.drops: Counter[str] = Counter()
        self.costs = TierCosts()

    def room(self, slot_bytes: int) -> int | None:
        """Blocks that still fit under the in-flight bound (``None``: no bound)."""
        bound = self.spec.max_inflight_bytes
        if not bound:
            return None
        queued = len(self.queue) * slot_bytes
        return max(0, (bound - self.inflight_bytes - queued) // slot_bytes)


__all__ = ["TIER_COUNTERS", "RequestState", "TierJobState", "TierState", "request_state"]
