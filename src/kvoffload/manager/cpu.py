"""The offloading manager: block bookkeeping for a CPU tier (no data moves here).

:class:`CPUOffloadingManager` has vLLM's API (``lookup``, two-phase ``prepare_load`` /
``complete_load`` and ``prepare_store`` / ``complete_store``, ``on_new_request``,
``on_request_finished``, ``reset_cache``, ``take_events``, ``get_stats``, ``shutdown``), so a
driver written for vLLM's manager runs unchanged, with these semantics:

* Slots are handed out fresh first (0, 1, 2, ...), then reused last-freed-first.
* ``prepare_store`` skips keys already stored (ready ones count as a use, pending ones belong
  to another store), protects every offered key from eviction, and is all-or-nothing unless
  ``partial_store=True`` (then it stores the longest prefix of the new keys that fits). A
  store that cannot fit returns ``None``; when the evictable count alone says it cannot fit,
  the policy is not called and no cache state changes.
* A pending block (being written) is ``HIT_PENDING`` and never evicted; a block being read is
  pinned (counted once however many loads share it) and never evicted.
* Each request's access counts once per key for the policy (``touch`` is deduplicated per
  request), so repeated touches cannot inflate frequency-based policies.
* Completions: a failed store frees its slots and leaves no key behind. A duplicate
  ``complete_store`` of a ready key is ignored (counted). A completion of a job prepared
  before ``reset_cache`` is ignored (counted): each request's in-flight jobs are stamped with
  the cache generation, so stale completions never touch new blocks. Completing a key that
  was never prepared raises ``ValueError`` and changes nothing.

Threading model: one scheduler thread calls the manager. When completions arrive from other
threads, build the manager with ``thread_safe=True``: every public method then holds one
lock (see ``benchmarks/manager_lock_cost.py`` for its cost).
"""

from __future__ import annotations

import enum
import functools
import logging
import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from kvoffload.admission import AdmissionFilter, build_admission
from kvoffload.context import ReqContext
from kvoffload.events import CPU_MEDIUM, OffloadingEvent
from kvoffload.keys import OffloadKey
from kvoffload.policies import BlockStatus, CachePolicy, create_cache_policy

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class LookupResult(enum.Enum):
    """Outcome of looking up one key (vLLM's values)."""

    MISS = "miss"
    HIT = "hit"  # stored and readable
    HIT_PENDING = "hit_pending"  # stored, but its write has not completed yet
    RETRY = "retry"  # location unknown yet (async tiers); the CPU tier never returns it


class OffloadPolicy(enum.Enum):
    """Which blocks of a request a tier wants offered (vLLM's ``RequestOffloadingContext``)."""

    CHUNK_LEVEL = "chunk_level"  # skip blocks that were prefix hits
    REQUEST_LEVEL = "request_level"  # every block of the request


_MISS = LookupResult.MISS
_block_id = operator.attrgetter("block_id")
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING


@dataclass(frozen=True)
class RequestOffloadingContext:
    """What ``on_new_request`` returns: the tier's per-request preferences."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


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
    """What ``access_blocks`` did: each key's lookup result and the stores it made."""

    results: list[LookupResult]
    stored: int  # misses stored (their writes completed)
    evicted: int  # blocks evicted to make room
    failed: int  # misses that found no room (or that admission rejected, with filters on)


class OffloadingManager(ABC):
    """Scheduler-side contract of an offloading tier (vLLM's ``OffloadingManager`` shape)."""

    @abstractmethod
    def lookup(self, key: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        """Is ``key`` stored and readable? Pure: no recency or statistics of the policy change."""

    @abstractmethod
    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        """Pin ready ``keys`` for reading until ``complete_load``; return their slots."""

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext | None = None) -> None:  # noqa: B027
        """Record a use of ``keys`` (e.g. a GPU prefix-cache hit on them)."""

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:  # noqa: B027
        """Unpin ``keys`` after their load finished."""

    @abstractmethod
    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the keys not stored yet (evicting if needed), or ``None``."""

    def complete_store(  # noqa: B027
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
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
        """Whether the engine must keep stepping for this tier (never for the CPU tier)."""
        return False

    def shutdown(self) -> None:  # noqa: B027
        """Release resources."""


class _RequestRecord:
    """Per-request bookkeeping kept in the request's ``ReqContext`` (no global map to leak).

    ``stores`` / ``loads`` hold the jobs prepared in ``generation``; when the cache is reset
    while jobs are in flight they move to ``stale_stores`` / ``stale_loads``, so their
    completions are recognised and ignored.
    """

    __slots__ = ("generation", "loads", "stale_loads", "stale_stores", "stores", "touched")

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.touched: set[OffloadKey] = set()
        self.stores: set[OffloadKey] = set()
        self.loads: dict[OffloadKey, int] = {}  # key -> loads in flight
        self.stale_stores: set[OffloadKey] = set()
        self.stale_loads: dict[OffloadKey, int] = {}

    def start_generation(self, generation: int) -> None:
        self.generation = generation
        self.touched.clear()
        self.stale_stores |= self.stores
        self.stores = set()
        for key, count in self.loads.items():
            self.stale_loads[key] = self.stale_loads.get(key, 0) + count
        self.loads = {}


def _locked(lock: threading.RLock, method: F) -> F:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _touches_misses(policy: CachePolicy) -> bool:
    """Whether the manager must touch keys that are not stored (see ``touches_misses``).

    A subclass that overrides ``touch`` below the class that declared it needless gets them.
    """
    if policy.touches_misses:
        return True
    owner = next(c for c in type(policy).__mro__ if "touches_misses" in vars(c))
    return type(policy).touch is not getattr(owner, "touch", None)


_PUBLIC_METHODS = (
    "lookup",
    "access_blocks",
    "prepare_load",
    "touch",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_new_request",
    "on_request_finished",
    "take_events",
    "reset_cache",
    "get_stats",
)


class CPUOffloadingManager(OffloadingManager):
    """Bookkeeping of a fixed pool of CPU slots with a pluggable eviction policy.

    Args:
        num_blocks: number of slots (offloaded blocks the tier holds).
        cache_policy: policy name (``"lru"``, ``"arc"``, any registered or entry-point name,
            ``"module:Class"``) or a ``CachePolicy`` instance built by the caller.
        cache_policy_module_path: module of an unregistered policy class named ``cache_policy``.
        cache_policy_params: keyword parameters for the policy's constructor.
        enable_events: record :class:`OffloadingEvent` s for ``take_events``.
        store_threshold: admit a block on its N-th offer (0 or 1: store everything).
        max_tracker_size: bound of the offer tracker used when ``store_threshold >= 2``.
        admission: extra admission filter(s) (see :mod:`kvoffload.admission`).
        skip_partial_tail: never store the request's last, partial block.
        partial_store: store the longest prefix that fits instead of nothing.
        thread_safe: guard every public method with one lock.
    """

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str | CachePolicy = "lru",
        cache_policy_module_path: str | None = None,
        cache_policy_params: Mapping[str, Any] | None = None,
        enable_events: bool = False,
        store_threshold: int = 0,
        max_tracker_size: int = 64000,
        admission: AdmissionFilter | Sequence[AdmissionFilter] | None = None,
        skip_partial_tail: bool = False,
        partial_store: bool = False,
        thread_safe: bool = False,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks must be an int, got {type(num_blocks).__name__}")
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        if isinstance(cache_policy, CachePolicy):
            if cache_policy_params:
                raise ValueError("cache_policy_params cannot be used with a policy instance")
            self._policy = cache_policy
        else:
            self._policy = create_cache_policy(
                cache_policy, num_blocks, cache_policy_module_path, dict(cache_policy_params or {})
            )
        self._admission = build_admission(
            admission, store_threshold, max_tracker_size, skip_partial_tail
        )
        self._enable_events = enable_events
        self._partial_store = partial_store
        self._events: list[OffloadingEvent] = []
        self._generation = 0
        self._num_allocated = 0
        self._free: list[BlockStatus] = []  # statuses of freed slots, reused last-freed-first
        self._num_evictable = 0
        self._num_pending = 0
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "lookups",
                "hits",
                "hits_pending",
                "misses",
                "loads",
                "stores_prepared",
                "stores_completed",
                "stores_failed",
                "admission_rejects",
                "evictions",
                "failed_allocations",
                "stale_completions",
                "duplicate_completions",
                "resets",
            ),
            0,
        )
        self._lookups = self._hits = self._hits_pending = 0
        self._get = self._status_getter()
        self._touch_misses = _touches_misses(self._policy)
        if thread_safe:
            lock = threading.RLock()
            for name in _PUBLIC_METHODS:
                setattr(self, name, _locked(lock, getattr(self, name)))

    # ----------------------------------------------------------------- helpers
    @property
    def policy(self) -> CachePolicy:
        """The eviction policy instance (read-only access for introspection)."""
        return self._policy

    @property
    def generation(self) -> int:
        """Bumped by every ``reset_cache``."""
        return self._generation

    def _status_getter(self) -> Callable[[OffloadKey], BlockStatus | None]:
        """The policy's block table lookup (C-level) when it exposes one, else its ``get``."""
        table = self._policy.block_table
        self._table = table if isinstance(table, dict) else None
        return table.get if table is not None else self._policy.get

    def _record(self, ctx: ReqContext | None) -> _RequestRecord:
        if ctx is None:
            raise ValueError("this call needs the request's ReqContext")
        record = ctx.get_state(_RequestRecord)
        if record is None:
            record = _RequestRecord(self._generation)
            ctx.set_state(record)
        elif record.generation != self._generation:
            record.start_generation(self._generation)  # the request outlived a reset
        return record

    def _touch_once(
        self, record: _RequestRecord, keys: Iterable[OffloadKey], ctx: ReqContext | None
    ) -> None:
        touched = record.touched
        fresh = list(keys) if not touched else [k for k in keys if k not in touched]
        if fresh:
            touched.update(fresh)
            self._policy.touch(fresh, ctx)

    # --------------------------------------------------------------- the API
    def lookup(self, key: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        self._lookups += 1
        status = self._get(key)
        if status is None:
            return _MISS
        if status.ref_cnt >= 0:
            self._hits += 1
            return _HIT
        self._hits_pending += 1
        return _HIT_PENDING

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        get = self._get
        found = [get(key) for key in keys]
        statuses: list[BlockStatus] = []
        for key, status in zip(keys, found, strict=True):
            if status is None or status.ref_cnt < 0:
                state = "not stored" if status is None else "still being written"
                raise ValueError(
                    f"prepare_load: key {key.hex()} is {state}; load only keys whose lookup "
                    "returned HIT"
                )
            statuses.append(status)
        record = self._record(ctx)
        self._touch_once(record, keys, ctx)
        mark_non_evictable = self._policy.mark_non_evictable
        loads = record.loads
        pinned_now = 0
        for key, status in zip(keys, statuses, strict=True):
            if status.ref_cnt == 0:
                mark_non_evictable(key)
                pinned_now += 1
            status.ref_cnt += 1
            loads[key] = loads.get(key, 0) + 1
        self._num_evictable -= pinned_now
        self._counters["loads"] += len(keys)
        return CPULoadStoreSpec([s.block_id for s in statuses], self._generation)

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        record = self._record(ctx)
        loads = record.loads
        stale_loads = record.stale_loads
        for key in keys:
            if key not in loads and key not in stale_loads:
                raise ValueError(
                    f"complete_load: key {key.hex()} has no load in flight for request "
                    f"'{ctx.req_id}'"
                )
        get = self._get
        released: list[OffloadKey] = []
        for key in reversed(keys):  # tail first, so the head ends most recent
            count = loads.get(key)
            if count is None:  # prepared before a reset: the pin is gone with the old cache
                left = stale_loads[key] - 1
                if left:
                    stale_loads[key] = left
                else:
                    del stale_loads[key]
                self._counters["stale_completions"] += 1
                continue
            if count == 1:
                del loads[key]
            else:
                loads[key] = count - 1
            status = get(key)
            if status is None or status.ref_cnt <= 0:  # cannot happen unless state was corrupted
                raise RuntimeError(f"complete_load: key {key.hex()} is not pinned")
            status.ref_cnt -= 1
            if status.ref_cnt == 0:
                released.append(key)
        if released:
            self._policy.mark_evictable_many(released)
            self._num_evictable += len(released)

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext | None = None) -> None:
        if ctx is None:
            self._policy.touch(list(keys), None)
            return
        self._touch_once(self._record(ctx), keys, ctx)

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        get = self._get
        record = self._record(ctx)
        table = self._table
        protected_evictable = 0
        if table is not None and table.keys().isdisjoint(keys):
            statuses: list[BlockStatus | None] = []  # none stored: the usual case, C-level
        else:
            statuses = [get(key) for key in keys]
        if any(statuses):  # some offered keys are stored already: the slower, rarer path
            absent = []
            accessed = []  # absent, or stored and ready (a use); pending ones belong to others
            for key, status in zip(keys, statuses, strict=True):
                if status is None:
                    absent.append(key)
                    accessed.append(key)
                elif status.ref_cnt >= 0:
                    accessed.append(key)
                    if status.ref_cnt == 0:
                        protected_evictable += 1
        else:
            absent = accessed = list(keys)
        to_store = absent
        if absent and self._admission is not None:
            to_store = self._admission.admit(absent, ctx)
            self._counters["admission_rejects"] += len(absent) - len(to_store)

        num_free = self.num_blocks - self._num_allocated + len(self._free)
        need = len(to_store) - num_free
        available = self._num_evictable - protected_evictable
        if need > available:
            if not self._partial_store or num_free + available <= 0:
                self._counters["failed_allocations"] += 1
                return None
            to_store = to_store[: num_free + available]
            need = len(to_store) - num_free

        # One access per request and key, misses included (ghost learning), head first.
        if self._touch_misses or accessed is not absent:
            self._touch_once(record, accessed, ctx)
        if not to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec([], self._generation), [])
        free_list = self._free
        evicted_keys: list[OffloadKey] = []
        if need > 0:
            victims = self._policy.evict(need, set(keys))
            if victims is None:
                self._counters["failed_allocations"] += 1
                return None
            victim_keys, victim_statuses = zip(*victims, strict=True)
            evicted_keys = list(victim_keys)
            free_list.extend(victim_statuses)
            self._num_evictable -= len(victims)
            self._counters["evictions"] += len(victims)
            if self._enable_events:
                self._events.append(OffloadingEvent(tuple(evicted_keys), removed=True))

        count = len(to_store)
        first_fresh = self._num_allocated
        fresh = min(self.num_blocks - first_fresh, count)
        allocated = [BlockStatus(slot, -1) for slot in range(first_fresh, first_fresh + fresh)]
        self._num_allocated += fresh
        if count > fresh:  # reuse freed slots (and their status objects), last freed first
            reused = free_list[fresh - count :]
            del free_list[fresh - count :]
            reused.reverse()
            for status in reused:
                status.ref_cnt = -1
            allocated += reused
        slots = list(map(_block_id, allocated))
        self._policy.insert_many(to_store, allocated, ctx)
        record.stores.update(to_store)
        self._num_pending += count
        self._counters["stores_prepared"] += count
        return PrepareStoreOutput(to_store, CPULoadStoreSpec(slots, self._generation), evicted_keys)

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        record = self._record(ctx)
        stores = record.stores
        get = self._get
        in_flight = len(stores)
        if success and stores.issuperset(keys):
            stores.difference_update(keys)
            if in_flight - len(stores) != len(keys):  # a key repeated in the call
                stores.update(keys)
        if success and in_flight - len(stores) == len(keys):
            # The usual case: this request's writes, all in flight in this generation, so all
            # pending by construction (only the manager changes ref_cnt).
            completed = list(reversed(keys))  # tail first, so the head ends most recent
            for status in map(get, completed):
                status.ref_cnt = 0  # type: ignore[union-attr]
            self._policy.mark_evictable_many(completed)
            self._num_pending -= len(completed)
            self._num_evictable += len(completed)
            self._counters["stores_completed"] += len(completed)
            if completed and self._enable_events:
                self._events.append(OffloadingEvent(tuple(keys)))
            return
        if not stores.issuperset(keys):
            for key in keys:
                if key not in stores and key not in record.stale_stores:
                    status = get(key)
                    if status is None or status.ref_cnt < 0:
                        raise ValueError(
                            f"complete_store: key {key.hex()} has no store in flight for "
                            f"request '{ctx.req_id}'"
                        )
        policy = self._policy
        done: list[OffloadKey] = []
        for key in reversed(keys):  # tail first, so the head ends most recent
            if key not in stores:
                if key in record.stale_stores:
                    record.stale_stores.discard(key)
                    self._counters["stale_completions"] += 1
                else:
                    self._counters["duplicate_completions"] += 1
                continue
            stores.discard(key)
            status = get(key)
            if status is None or status.ref_cnt != -1:  # cannot happen unless state was corrupted
                raise RuntimeError(f"complete_store: key {key.hex()} is not being written")
            if success:
                status.ref_cnt = 0
            else:
                policy.remove(key)
                self._free.append(status)
            done.append(key)
        self._num_pending -= len(done)
        if success:
            policy.mark_evictable_many(done)
            self._num_evictable += len(done)
            self._counters["stores_completed"] += len(done)
            if done and self._enable_events:
                done.reverse()
                self._events.append(OffloadingEvent(tuple(done)))
        else:
            self._counters["stores_failed"] += len(done)

    def access_blocks(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> BlockAccesses:
        """Each key as an independent access, in order, in one call (libCacheSim's model).

        A HIT is loaded (``prepare_load`` + ``complete_load``), a MISS is stored
        (``prepare_store`` + ``complete_store``), a HIT_PENDING is left alone: the same policy
        calls, counters and slots as that per-key call sequence, without its per-call cost
        (the simulator's ``blocks`` mode is bound by it). With admission filters or events
        on, it makes exactly those public calls.
        """
        if self._admission is not None or self._enable_events:
            return self._access_blocks_by_calls(keys, ctx)
        record = self._record(ctx)
        touched = record.touched
        policy = self._policy
        # Single-key hooks: the contract makes them equal to the batch ones with one key.
        touch, evict, insert = policy.touch, policy.evict, policy.insert
        mark_non_evictable, mark_evictable = policy.mark_non_evictable, policy.mark_evictable
        get, free, capacity = self._get, self._free, self.num_blocks
        allocated, evictable = self._num_allocated, self._num_evictable
        touch_misses = self._touch_misses
        results: list[LookupResult] = []
        hits = pending = stored = evicted = failed = 0
        for key in keys:
            status = get(key)
            if status is not None:
                if status.ref_cnt < 0:  # being written: HIT_PENDING, nothing to store
                    pending += 1
                    results.append(_HIT_PENDING)
                    continue
                hits += 1
                results.append(_HIT)
                if key not in touched:
                    touched.add(key)
                    touch([key], ctx)
                if status.ref_cnt == 0:  # pinned and released at once: net count unchanged
                    mark_non_evictable(key)
                    mark_evictable(key)
                continue
            results.append(_MISS)
            if allocated < capacity:
                status = BlockStatus(allocated, -1)
                allocated += 1
            elif free:
                status = free.pop()
                status.ref_cnt = -1
            elif evictable == 0:
                failed += 1
                continue
            else:
                if touch_misses and key not in touched:
                    touched.add(key)
                    touch([key], ctx)
                victims = evict(1, {key})
                if victims is None:
                    failed += 1
                    continue
                status = victims[0][1]
                status.ref_cnt = -1
                evictable -= 1
                evicted += 1
                insert(key, status, ctx)
                status.ref_cnt = 0
                mark_evictable(key)
                evictable += 1
                stored += 1
                continue
            if touch_misses and key not in touched:
                touched.add(key)
                touch([key], ctx)
            insert(key, status, ctx)
            status.ref_cnt = 0
            mark_evictable(key)
            evictable += 1
            stored += 1
        self._num_allocated, self._num_evictable = allocated, evictable
        self._lookups += len(results)
        self._hits += hits
        self._hits_pending += pending
        counters = self._counters
        counters["loads"] += hits
        counters["stores_prepared"] += stored
        counters["stores_completed"] += stored
        counters["evictions"] += evicted
        counters["failed_allocations"] += failed
        return BlockAccesses(results, stored, evicted, failed)

    def _access_blocks_by_calls(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> BlockAccesses:
        """``access_blocks`` made of the public calls (admission filters and events need them)."""
        results: list[LookupResult] = []
        stored = evicted = failed = 0
        for key in keys:
            result = self.lookup(key, ctx)
            results.append(result)
            one = [key]
            if result is _HIT:
                self.prepare_load(one, ctx)
                self.complete_load(one, ctx)
            elif result is _MISS:
                out = self.prepare_store(one, ctx)
                if out is None:
                    failed += 1
                elif out.keys_to_store:
                    self.complete_store(out.keys_to_store, ctx)
                    stored += 1
                    evicted += len(out.evicted_keys)
        return BlockAccesses(results, stored, evicted, failed)

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self._record(ctx)
        return RequestOffloadingContext()

    def on_request_finished(self, ctx: ReqContext) -> None:
        record = ctx.get_state(_RequestRecord)
        if record is not None:
            record.touched.clear()
        self._policy.on_request_finished(ctx)

    def take_events(self) -> list[OffloadingEvent]:
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> None:
        self._policy.clear()
        self._get = self._status_getter()
        self._generation += 1
        self._num_allocated = 0
        self._free.clear()
        self._num_evictable = 0
        self._num_pending = 0
        if self._admission is not None:
            self._admission.reset()
        self._counters["resets"] += 1
        if self._enable_events:
            self._events.append(OffloadingEvent((), removed=True, reset=True))

    def get_stats(self) -> OffloadingStats:
        c = self._counters
        stored = self._num_allocated - len(self._free)
        return OffloadingStats(
            num_blocks=self.num_blocks,
            stored_blocks=stored,
            pending_blocks=self._num_pending,
            pinned_blocks=stored - self._num_pending - self._num_evictable,
            evictable_blocks=self._num_evictable,
            lookups=self._lookups,
            hits=self._hits,
            hits_pending=self._hits_pending,
            misses=self._lookups - self._hits - self._hits_pending,
            loads=c["loads"],
            stores_prepared=c["stores_prepared"],
            stores_completed=c["stores_completed"],
            stores_failed=c["stores_failed"],
            admission_rejects=c["admission_rejects"],
            evictions=c["evictions"],
            failed_allocations=c["failed_allocations"],
            stale_completions=c["stale_completions"],
            duplicate_completions=c["duplicate_completions"],
            resets=c["resets"],
            generation=self._generation,
            policy=dict(self._policy.stats()),
        )

    def shutdown(self) -> None:
        self._events.clear()


__all__ = [
    "BlockAccesses",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "LookupResult",
    "OffloadPolicy",
    "OffloadingManager",
    "OffloadingStats",
    "PrepareStoreOutput",
    "RequestOffloadingContext",
]
