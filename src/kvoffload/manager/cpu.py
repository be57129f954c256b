"""CPUOffloadingManager: the bookkeeping of a fixed pool of CPU slots (no data moves here)."""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from threading import get_ident
from typing import Any, NoReturn

from kvoffload._checks import check_int
from kvoffload.admission import AdmissionFilter, build_admission
from kvoffload.context import ReqContext
from kvoffload.events import OffloadingEvent
from kvoffload.keys import OffloadKey
from kvoffload.manager.api import (
    BlockAccesses,
    CPULoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingStats,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from kvoffload.manager.counters import Counters
from kvoffload.manager.keyargs import check_key_types, describe_key, key_list, wrong_key_type
from kvoffload.manager.ledger import BlockLedger
from kvoffload.manager.locked import locked_class
from kvoffload.manager.observers import AccessObserver, check_observers
from kvoffload.manager.recorder import TraceRecorder
from kvoffload.manager.records import RequestRecord
from kvoffload.manager.state import decode_manager_state, encode_manager_state
from kvoffload.policies import (
    BlockStatus,
    CachePolicy,
    SwitchReport,
    create_cache_policy,
)

logger = logging.getLogger(__name__)

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING
_block_id = operator.attrgetter("block_id")
_BIND_LOCK = threading.Lock()


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
        thread_safe: guard every public method with one lock (the instance's class becomes
            ``locked_class(cls)``); without it, a call from a second thread raises.
        observers: components that watch the key stream
            (:class:`~kvoffload.manager.observers.AccessObserver`): each request's keys, once
            each where the policy is touched, its end, and their gauges in
            ``get_stats().policy``. Shadows of candidate policies are one: build a
            :class:`~kvoffload.selection.shadow.ShadowEvaluator` and pass it here.
        recorder: a :class:`~kvoffload.manager.recorder.TraceRecorder` that writes each
            request's keys and hints as a trace ``kvoffload simulate`` replays (also
            :meth:`set_recorder`).

    The blocks and their slots live in a :class:`~kvoffload.manager.ledger.BlockLedger`,
    the one place where a block's status changes; the manager adds requests, admission,
    counters, events, observers and the recorder around it.
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
        observers: Iterable[AccessObserver] = (),
        recorder: TraceRecorder | None = None,
    ) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, 0)
        if isinstance(cache_policy, CachePolicy):
            if cache_policy_params:
                raise ValueError("cache_policy_params cannot be used with a policy instance")
            policy = cache_policy
        else:
            policy = create_cache_policy(
                cache_policy, num_blocks, cache_policy_module_path, dict(cache_policy_params or {})
            )
        self._admission = build_admission(
            admission, store_threshold, max_tracker_size, skip_partial_tail
        )
        self._enable_events = enable_events
        self._partial_store = partial_store
        self._events: list[OffloadingEvent] = []
        self._generation = 0
        self._counters = Counters()
        # The thread that calls the manager: bound by the first call (0: none yet); None once
        # shut down. A mismatch sends the call to _other_thread, which decides.
        self._owner: int | None = 0
        self._shut_down = False
        self._thread_safe = thread_safe
        self._ledger = BlockLedger(policy, num_blocks)
        self._bind_policy(policy)
        self._last_timestamp: float | None = None  # the latest request's, for switch_policy
        self._observers = check_observers(observers)
        self._recorder: TraceRecorder | None = None
        if recorder is not None:
            self.set_recorder(recorder)
        if thread_safe:
            self._lock = threading.RLock()
            self.__class__ = locked_class(type(self))

    # ----------------------------------------------------------------- the policy
    def _bind_policy(self, policy: CachePolicy) -> None:
        """Give the ledger ``policy``, and keep its status getter at hand for ``lookup``.
        Call it whenever the policy changes or is cleared."""
        ledger = self._ledger
        ledger.bind(policy)
        self._policy = policy
        self._table = ledger.table
        self._get: Callable[[OffloadKey], BlockStatus | None] = ledger.get
        self._touch_misses = ledger.touches_misses

    @property
    def policy(self) -> CachePolicy:
        """The eviction policy instance (read-only access for introspection)."""
        return self._policy

    def switch_policy(
        self,
        cache_policy: str | CachePolicy,
        cache_policy_module_path: str | None = None,
        req_context: ReqContext | None = None,
        **params: Any,
    ) -> SwitchReport:
        """Replace the eviction policy on the live cache, dropping no block.

        ``cache_policy`` is a name (with ``params`` for its constructor) or a fresh, empty
        ``CachePolicy`` holding ``num_blocks``; the blocks move in the old policy's eviction
        order (:meth:`~kvoffload.manager.ledger.BlockLedger.replace_policy`). Raises before
        anything changes when the new policy cannot be built or cannot take the blocks.

        The moves are made under ``req_context`` (default: stamped with the latest request's
        ``timestamp``), so a policy that keeps time by the requests' timestamps (``kvaware``)
        stays on their clock instead of counting a tick per moved block.
        """
        self._check_entry()
        if isinstance(cache_policy, CachePolicy):
            if params or cache_policy_module_path is not None:
                raise ValueError("params cannot be used with a policy instance")
            new = cache_policy
        elif isinstance(cache_policy, str):
            new = create_cache_policy(
                cache_policy, self.num_blocks, cache_policy_module_path, dict(params)
            )
        else:
            raise TypeError(
                "cache_policy must be a policy name or a CachePolicy instance, got "
                f"{type(cache_policy).__name__}"
            )
        old = self._policy
        if new is old:
            raise ValueError("cache_policy is the current policy; pass a fresh one")
        if old.block_table is None:
            raise ValueError(
                f"switch_policy needs the current policy's block_table; {type(old).__name__} "
                "keeps none, so the stored keys are unknown"
            )
        if req_context is None:
            req_context = ReqContext(req_id="kvoffload-switch", timestamp=self._last_timestamp)
        report = self._ledger.replace_policy(new, req_context)
        self._bind_policy(new)
        self._counters.policy_switches += 1
        logger.info(
            "kvoffload: switched policy %s -> %s (%d ready, %d pinned, %d pending blocks moved)",
            type(old).__name__,
            type(new).__name__,
            report.evictable,
            report.pinned,
            report.pending,
        )
        return report

    # ----------------------------------------------------------------- warm restarts
    def export_state(self) -> bytes:
        """The cache's state for a warm restart (:meth:`from_state`; what it holds:
        :mod:`kvoffload.manager.state`)."""
        self._check_entry()
        return encode_manager_state(self.num_blocks, self._policy)

    @classmethod
    def from_state(cls, data: bytes | str, **options: Any) -> CPUOffloadingManager:
        """A manager that resumes the cache :meth:`export_state` saved (the same blocks in
        the same slots, the same decisions); ``options`` are the constructor's other
        arguments. Blocks that were being written are dropped; pins are released."""
        for name in (
            "num_blocks",
            "cache_policy",
            "cache_policy_module_path",
            "cache_policy_params",
        ):
            if name in options:
                raise TypeError(f"from_state: {name} comes from the saved state, not an option")
        num_blocks, policy, statuses = decode_manager_state(data)
        manager = cls(num_blocks, cache_policy=policy, **options)
        manager._ledger.restore(statuses)
        return manager

    def set_recorder(self, recorder: TraceRecorder | None) -> None:
        """Record every request from now on into ``recorder`` (``None``: stop recording)."""
        if recorder is not None and not isinstance(recorder, TraceRecorder):
            raise TypeError(f"recorder must be a TraceRecorder, got {type(recorder).__name__}")
        self._recorder = recorder

    @property
    def recorder(self) -> TraceRecorder | None:
        return self._recorder

    @property
    def observers(self) -> tuple[AccessObserver, ...]:
        """The components fed by the live key stream (``observers``), in order."""
        return self._observers

    @property
    def generation(self) -> int:
        """Bumped by every ``reset_cache``."""
        return self._generation

    # ----------------------------------------------------------------- parts
    @property
    def admission(self) -> AdmissionFilter | None:
        """The admission filter(s) combined, or ``None`` when every block is admitted."""
        return self._admission

    @property
    def events_enabled(self) -> bool:
        return self._enable_events

    def _request_record(self, ctx: ReqContext | None) -> RequestRecord:
        """The request's bookkeeping (created on first use; renewed after a reset).

        Every call that changes state starts here, so the thread and shutdown checks are
        made here, once per call.
        """
        if self._owner != get_ident():
            self._other_thread()
        if ctx is None:
            raise ValueError("this call needs the request's ReqContext")
        record = ctx.get_state(RequestRecord)
        if record is None:
            record = RequestRecord(self._generation)
            ctx.set_state(record)
            if ctx.timestamp is not None:  # once per request: the clock a switch goes by
                self._last_timestamp = ctx.timestamp
        elif record.generation != self._generation:
            record.start_generation(self._generation)  # the request outlived a reset
        return record

    # ----------------------------------------------------------------- checks
    def _check_entry(self) -> None:
        """The thread and shutdown checks, for calls without a request."""
        if self._owner != get_ident():
            self._other_thread()

    def _other_thread(self) -> None:
        """A call from a thread other than the bound one (or the first call, or after
        shutdown): bind the thread, or raise before anything changes."""
        if self._shut_down:
            raise RuntimeError(
                f"{type(self).__name__} was shut down; build a new manager to keep offloading"
            )
        ident = get_ident()
        if self._thread_safe:
            self._owner = ident
            return
        with _BIND_LOCK:  # two first calls at once: only one thread binds
            if self._owner == 0:
                self._owner = ident
        if self._owner == ident:
            return
        raise RuntimeError(
            f"{type(self).__name__} is used by thread {self._owner} and was called from thread "
            f"{ident}: a manager without a lock must be called from one thread. Build it "
            "with thread_safe=True when completions (or any call) come from other threads"
        )

    def _shut_down_get(self, key: OffloadKey) -> NoReturn:
        self._other_thread()  # raises: shut down
        raise AssertionError("unreachable")  # pragma: no cover

    def _touch_once(
        self, record: RequestRecord, keys: Iterable[OffloadKey], ctx: ReqContext | None
    ) -> None:
        """Touch the keys this request has not accessed yet (each once, in order)."""
        fresh = self._ledger.access(record.touched, keys, ctx)
        if fresh and self._observers:
            for observer in self._observers:
                observer.record(fresh, ctx)

    # --------------------------------------------------------------- the API
    def lookup(self, key: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        status = self._get(key)
        if status is None:
            self._counters.misses += 1
            return _MISS
        if status.ref_cnt >= 0:
            self._counters.hits += 1
            return _HIT
        self._counters.hits_pending += 1
        return _HIT_PENDING

    def prepare_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        if type(keys) is not list:
            keys = key_list(keys, "prepare_load")
        record = self._request_record(ctx)
        get = self._get
        statuses = [get(key) for key in keys]
        for key, status in zip(keys, statuses, strict=True):
            if status is None or status.ref_cnt < 0:
                state = "not stored" if status is None else "still being written"
                raise wrong_key_type(key, "prepare_load") or ValueError(
                    f"prepare_load: key {describe_key(key)} is {state}; load only keys whose "
                    "lookup returned HIT"
                )
        self._touch_once(record, keys, ctx)
        self._ledger.pin(keys, statuses)  # type: ignore[arg-type]
        loads = record.loads
        for key in keys:
            loads[key] = loads.get(key, 0) + 1
        self._counters.loads += len(keys)
        if self._recorder is not None:
            self._recorder.add_keys(ctx, keys)
        return CPULoadStoreSpec(
            [s.block_id for s in statuses],  # type: ignore[union-attr]
            self._generation,
        )

    def complete_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        if type(keys) is not list:
            keys = key_list(keys, "complete_load")
        record = self._request_record(ctx)
        loads = record.loads
        for key in keys:
            if key not in loads and not record.has_stale_load(key):
                raise wrong_key_type(key, "complete_load") or ValueError(
                    f"complete_load: key {describe_key(key)} has no load in flight for "
                    f"request '{ctx.req_id}'"
                )
        pool = self._ledger.pool
        counters = self._counters
        unpinned: list[OffloadKey] = []
        for key in reversed(keys):  # tail first, so the head ends most recent
            count = loads.get(key)
            if count is None:
                # Prepared before a reset (the pin went with the old cache: its slot comes
                # back now), or one more completion than loads (ignored).
                generation = record.stale_load_done(key)
                if generation is None:
                    counters.duplicate_completions += 1
                else:
                    pool.job_done(generation, key)
                    counters.stale_completions += 1
                continue
            if count == 1:
                del loads[key]
            else:
                loads[key] = count - 1
            unpinned.append(key)
        self._ledger.unpin(unpinned)

    def touch(self, keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> None:
        if type(keys) is not list:
            keys = key_list(keys, "touch")
        check_key_types(keys, "touch")
        if ctx is None:
            self._check_entry()
            self._ledger.access(None, keys, None)
            for observer in self._observers:
                observer.record(keys, None)
            return
        self._touch_once(self._request_record(ctx), keys, ctx)

    def prepare_store(
        self, keys: Iterable[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        if type(keys) is not list:
            keys = key_list(keys, "prepare_store")
        return self._reserve(keys, ctx, self._admission, "prepare_store")

    def _reserve(
        self,
        keys: list[OffloadKey],
        ctx: ReqContext,
        admission: AdmissionFilter | None,
        caller: str,
    ) -> PrepareStoreOutput | None:
        """Slots for the absent ``keys`` (a store, or a promotion without ``admission``);
        every key offered is protected and accessed once."""
        store = caller == "prepare_store"
        record = self._request_record(ctx)
        try:
            offered = set(keys)  # all protected from eviction (built anyway when evicting)
        except TypeError:
            check_key_types(keys, caller)
            raise
        if len(offered) != len(keys):  # a repeated key is offered once, at its first place
            keys = list(dict.fromkeys(keys))
        get = self._get
        table = self._table
        protected_evictable = 0
        if table is not None and table.keys().isdisjoint(offered):
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
        if absent:
            check_key_types(absent, caller)  # the keys that may enter the cache
        to_store = absent
        counters = self._counters
        if self._recorder is not None:
            self._recorder.add_keys(ctx, keys)
        if absent and admission is not None:
            to_store = admission.admit(absent, ctx)
            counters.admission_rejects += len(absent) - len(to_store)

        ledger = self._ledger
        num_free = ledger.num_free
        available = ledger.pool.num_evictable - protected_evictable
        if len(to_store) - num_free > available:
            if not self._partial_store or num_free + available <= 0:
                counters.failed_allocations += store
                return None
            to_store = to_store[: num_free + available]

        # One access per request and key, misses included (ghost learning), head first.
        if self._touch_misses or accessed is not absent:
            self._touch_once(record, accessed, ctx)
        elif self._observers:  # the policy skips misses; the observers see them
            touched = record.touched
            fresh = [key for key in accessed if key not in touched]
            for observer in self._observers:
                observer.record(fresh, ctx)
        if not to_store:
            return PrepareStoreOutput([], CPULoadStoreSpec([], self._generation), [])
        evicted_keys = ledger.make_room(len(to_store), offered)
        if evicted_keys is None:
            counters.failed_allocations += store
            return None
        if evicted_keys:
            counters.evictions += len(evicted_keys)
            if self._enable_events:
                self._events.append(OffloadingEvent(tuple(evicted_keys), removed=True))
        slots = list(map(_block_id, ledger.reserve(to_store, ctx)))
        if store:
            record.stores.update(to_store)
            counters.stores_prepared += len(to_store)
        return PrepareStoreOutput(to_store, CPULoadStoreSpec(slots, self._generation), evicted_keys)

    def complete_store(
        self, keys: Iterable[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        if type(keys) is not list:
            keys = key_list(keys, "complete_store")
        record = self._request_record(ctx)
        stores = record.stores
        get = self._get
        ledger = self._ledger
        counters = self._counters
        in_flight = len(stores)
        if success and stores.issuperset(keys):
            stores.difference_update(keys)
            if in_flight - len(stores) != len(keys):  # a key repeated in the call
                stores.update(keys)
        if success and in_flight - len(stores) == len(keys):
            # The usual case: this request's writes, all in flight in this generation, so all
            # pending by construction (only the manager changes ref_cnt).
            completed = list(reversed(keys))  # tail first, so the head ends most recent
            ledger.complete(completed)
            counters.stores_completed += len(completed)
            if completed and self._enable_events:
                self._events.append(OffloadingEvent(tuple(keys)))
            return
        if not stores.issuperset(keys):
            for key in keys:
                if key not in stores and not record.has_stale_store(key):
                    status = get(key)
                    if status is None or status.ref_cnt < 0:
                        raise wrong_key_type(key, "complete_store") or ValueError(
                            f"complete_store: key {describe_key(key)} has no store in flight "
                            f"for request '{ctx.req_id}'"
                        )
        done: list[OffloadKey] = []
        for key in reversed(keys):  # tail first, so the head ends most recent
            if key not in stores:
                generation = record.stale_store_done(key) if record.stale else None
                if generation is None:
                    counters.duplicate_completions += 1
                else:  # prepared before a reset: its slot comes back now
                    ledger.pool.job_done(generation, key)
                    counters.stale_completions += 1
                continue
            stores.discard(key)
            status = get(key)
            if status is None or status.ref_cnt != -1:  # cannot happen unless state was corrupted
                raise RuntimeError(f"complete_store: key {describe_key(key)} is not being written")
            done.append(key)
        self._end_writes(done, success)
        if success:
            counters.stores_completed += len(done)
        else:
            counters.stores_failed += len(done)

    def _end_writes(self, tail_first: list[OffloadKey], success: bool) -> None:
        """Pending blocks (tail first) were written: ready, with their event; or they were
        not: gone, their slots free."""
        if not success:
            self._ledger.fail(tail_first)
            return
        self._ledger.complete(tail_first)
        if tail_first and self._enable_events:
            self._events.append(OffloadingEvent(tuple(reversed(tail_first))))

    # ------------------------------------------------------- the face for secondary tiers
    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of a stored block (being written, ready or pinned), else ``None``."""
        status = self._get(key)
        return None if status is None else status.block_id

    def stores_in_flight(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> list[OffloadKey]:
        """Which of ``keys`` (once each, in order) this request's stores are writing."""
        stores = self._request_record(ctx).stores
        return [key for key in dict.fromkeys(keys) if key in stores]

    def reserve_promotion(
        self, keys: Iterable[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        """Slots for blocks a secondary tier will copy in (a promotion), as pending blocks.

        As :meth:`prepare_store`, but no admission filter vetoes it (the block earned its
        place in a tier already) and it counts as no store; :meth:`complete_promotion` ends
        it. ``None``: no room (nothing changed).
        """
        keys = key_list(keys, "reserve_promotion")
        return self._reserve(keys, ctx, None, "reserve_promotion")

    def complete_promotion(self, keys: Iterable[OffloadKey], success: bool = True) -> None:
        """The copies into slots :meth:`reserve_promotion` gave ended: the blocks are ready
        (tail first, as stores complete), or gone with their slots free."""
        self._check_entry()
        keys = list(dict.fromkeys(key_list(keys, "complete_promotion")))
        get = self._get
        for key in keys:
            status = get(key)
            if status is None or status.ref_cnt != -1:
                raise ValueError(
                    f"complete_promotion: key {describe_key(key)} has no promotion in flight"
                )
        keys.reverse()
        self._end_writes(keys, success)

    def pin_copy(self, keys: Iterable[OffloadKey]) -> list[int]:
        """Pin ready blocks while a tier copies them out; their slots. Not a load: no touch,
        no ``loads`` count, no request (:meth:`unpin_copy` ends it)."""
        self._check_entry()
        keys = key_list(keys, "pin_copy")
        statuses = [self._get(key) for key in keys]
        for key, status in zip(keys, statuses, strict=True):
            if status is None or status.ref_cnt < 0:
                raise ValueError(f"pin_copy: key {describe_key(key)} is not stored and ready")
        self._ledger.pin(keys, statuses)  # type: ignore[arg-type]
        return [status.block_id for status in statuses]  # type: ignore[union-attr]

    def unpin_copy(self, keys: Iterable[OffloadKey]) -> None:
        """The copies :meth:`pin_copy` pinned for are done (tail first, as loads complete)."""
        self._check_entry()
        keys = key_list(keys, "unpin_copy")
        self._ledger.unpin(list(reversed(keys)))

    def access_each(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> BlockAccesses:
        """Each of ``keys`` as one independent access, in order, in one call (the simulator's
        blocks mode), with the policy calls, counters and slots of the public calls per key
        (:func:`kvoffload.sim.drive.access_blocks_by_calls`, which admission filters, events,
        observers and a recorder need: this call makes none of their records).
        """
        if (
            self._admission is not None
            or self._enable_events
            or self._observers
            or self._recorder is not None
        ):
            raise ValueError(
                "access_each makes no admission, event, observer or recorder records; "
                "make the public calls one key at a time instead"
            )
        if type(keys) is not list:
            keys = key_list(keys, "access_each")
        record = self._request_record(ctx)
        out = self._ledger.access_each(keys, ctx, record.touched)
        counters = self._counters
        counters.misses += out.misses
        counters.hits += out.hits
        counters.hits_pending += out.pending
        counters.loads += out.hits
        counters.stores_prepared += out.stored
        counters.stores_completed += out.stored
        counters.evictions += out.evicted
        counters.failed_allocations += out.failed
        return BlockAccesses(out.results, out.stored, out.evicted, out.failed)

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self._request_record(ctx)
        return RequestOffloadingContext()

    def on_request_finished(self, ctx: ReqContext) -> None:
        self._check_entry()
        record = ctx.get_state(RequestRecord)
        if record is not None:
            record.touched.clear()
        self._policy.on_request_finished(ctx)
        for observer in self._observers:
            observer.request_finished(ctx)
        if self._recorder is not None:
            self._recorder.finish(ctx)

    def take_events(self) -> list[OffloadingEvent]:
        self._check_entry()
        events, self._events = self._events, []
        return events

    def reset_cache(self) -> None:
        """Drop every block; the slots of jobs in flight stay held until those jobs complete.

        A load may still be copying a slot to the device and a store may still be writing
        one: their slots are handed out again only after the job's (stale) completion, or
        after :meth:`release_stale_slots`.
        """
        self._check_entry()
        self._ledger.clear(self._generation)
        self._bind_policy(self._policy)
        self._generation += 1
        if self._admission is not None:
            self._admission.reset()
        self._counters.resets += 1
        if self._enable_events:
            self._events.append(OffloadingEvent((), removed=True, reset=True))

    def evict_ahead(
        self, n: int, protected: Collection[OffloadKey] = ()
    ) -> list[tuple[OffloadKey, int]]:
        """Evict up to ``n`` of the policy's next victims (none of ``protected``) now; their
        ``(key, slot)`` pairs.

        Why: a write-back tier must copy a victim out before its slot is reused, and a store
        needs its slots at once. So each slot stays *held* (neither stored nor free) until
        :meth:`release_evicted` hands it back.
        """
        self._check_entry()
        check_int("n", n, 0)
        victims = self._ledger.evict_held(n, protected)
        if not victims:
            return []
        self._counters.evictions += len(victims)
        if self._enable_events:
            self._events.append(OffloadingEvent(tuple(k for k, _ in victims), removed=True))
        return [(key, status.block_id) for key, status in victims]

    def release_evicted(self, slots: Iterable[int]) -> None:
        """The slots :meth:`evict_ahead` held have been copied out: they become free."""
        self._check_entry()
        pool = self._ledger.pool
        for slot in slots:
            if not pool.release_evicted(slot):
                raise ValueError(f"release_evicted: slot {slot!r} is not held by evict_ahead")

    @property
    def free_blocks(self) -> int:
        """Slots a store can take without evicting."""
        return self._ledger.num_free

    def release_stale_slots(self) -> int:
        """Every job prepared before the last reset is done (say, the worker was drained):
        their held slots become free. Returns how many; their late completions are ignored."""
        self._check_entry()
        return self._ledger.pool.release_held()

    def has_pending_work(self) -> bool:
        """Whether a store is being written, a load is being read, or a slot is still held
        for a job prepared before a reset: their completions are still due."""
        pool = self._ledger.pool
        return bool(pool.num_pending or pool.num_pinned or pool.num_held)

    def get_stats(self) -> OffloadingStats:
        """Counters and gauges (readable from any thread, and after shutdown)."""
        pool = self._ledger.pool
        return OffloadingStats(
            num_blocks=self.num_blocks,
            stored_blocks=pool.num_stored,
            pending_blocks=pool.num_pending,
            pinned_blocks=pool.num_pinned,
            evictable_blocks=pool.num_evictable,
            generation=self._generation,
            policy=self._policy_gauges(),
            held_blocks=pool.num_held,
            **self._counters.as_dict(),
        )

    def _policy_gauges(self) -> dict[str, float]:
        gauges = dict(self._policy.stats())
        for observer in self._observers:
            gauges.update(observer.stats())
        return gauges

    def shutdown(self) -> None:
        """Stop: every later call except ``get_stats``/``has_pending_work`` raises
        ``RuntimeError``. Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self._owner = None
        self._events.clear()
        self._table = None
        self._get = self._shut_down_get

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down


__all__ = ["CPUOffloadingManager"]
