"""Move a live cache's resident set from one policy into another, dropping no block.

Only the public :class:`~kvoffload.policies.base.CachePolicy` API is used, so any pair of
policies works, built-in or not. The order (documented, and what ``switch_resident_set``
does):

1. **Ready, unpinned blocks** leave the old policy through ``evict`` with nothing protected,
   which yields them in the old policy's own eviction order: least valuable first (for LRU
   that is least recent first). They enter the new policy in that same order, each as a
   completed store (``insert`` as being written, ``ref_cnt = 0``, ``mark_evictable``), so
   the block the old policy would have evicted first is the oldest in the new one too.
   Ready blocks the old policy will not evict (its own pins, e.g. ``retention``'s) follow
   them, as its most valuable. With ``frequencies`` given (a use count per key), each block
   is then touched once per extra use, right after its insert, so a frequency-using target
   (``lfu``, ``mq``, ``slru``, ...) sees the counts and recency order stays the same.
2. **Pinned blocks** (being read, ``ref_cnt > 0``) follow: they are in use, so most recent.
   Each enters as a completed store and is then pinned again (``ref_cnt`` restored,
   ``mark_non_evictable``): it stays protected throughout.
3. **Pending blocks** (being written, ``ref_cnt == -1``) come last and stay pending: the
   manager's completion calls ``mark_evictable`` on the new policy as usual.

:func:`warm_switch` does the same move after replaying a recent access log into ``new``, so
that it starts with the state (ghosts, frequencies, reuse classes) it would have learned.

The blocks' :class:`BlockStatus` objects move as they are (they are shared with the manager),
so slots and pin counts are unchanged. The old policy is cleared at the end: it is consumed.
The keys of pinned and pending blocks come from the old policy's ``block_table`` or, when it
keeps none, from ``resident_keys`` (every stored key; the manager knows them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy

_DRAIN_CHUNK = 256


@dataclass(frozen=True)
class SwitchReport:
    """What a switch moved: counts by kind, in the order they were moved."""

    evictable: int
    pinned: int
    pending: int
    replayed: int = 0  # with warm_switch: resident blocks the log's replay entered

    @property
    def moved(self) -> int:
        return self.evictable + self.pinned + self.pending


def drain_in_eviction_order(policy: CachePolicy) -> list[tuple[OffloadKey, BlockStatus]]:
    """Evict every evictable block of ``policy``, least valuable first; return them in order."""
    out: list[tuple[OffloadKey, BlockStatus]] = []
    empty: frozenset[OffloadKey] = frozenset()
    chunk = _DRAIN_CHUNK
    while True:
        victims = policy.evict(chunk, empty)
        if victims is None:
            if chunk == 1:
                return out
            chunk = 1  # fewer than a chunk left: one at a time to the end
            continue
        if not victims:
            return out
        out.extend(victims)


def switch_resident_set(
    old: CachePolicy,
    new: CachePolicy,
    resident_keys: Iterable[OffloadKey] | None = None,
    frequencies: Mapping[OffloadKey, int] | None = None,
    req_context: ReqContext | None = None,
) -> SwitchReport:
    """Move every block stored in ``old`` into the empty policy ``new`` (see module docstring).

    Raises ``ValueError`` when ``new`` already stores blocks or is smaller than the resident
    set, or when ``old`` keeps no block table and ``resident_keys`` is not given; in those
    cases nothing has changed. ``req_context`` is passed to every call on ``new`` (give one
    with the current ``timestamp`` to a policy that keeps time by it, e.g. ``kvaware``); its
    ``on_request_finished`` is called at the end.
    """
    statuses, _ = _resident(old, new, resident_keys)
    drained = drain_in_eviction_order(old)
    moved = set()
    touch = new.touch
    for key, status in drained:
        moved.add(key)
        _insert_ready(new, key, status, req_context)
        if frequencies is not None:
            extra = frequencies.get(key, 1) - 1
            one = [key]
            for _ in range(extra):
                touch(one, req_context)
    pinned = pending = kept = 0
    rest = [(key, status) for key, status in statuses.items() if key not in moved]
    for key, status in rest:  # ready blocks old would not give up (its own pins): keep them
        if status.ref_cnt == 0:
            _insert_ready(new, key, status, req_context)
            kept += 1
    for key, status in rest:
        if status.ref_cnt > 0:
            count = status.ref_cnt
            _insert_ready(new, key, status, req_context)
            status.ref_cnt = count
            new.mark_non_evictable(key)
            pinned += 1
    for key, status in rest:
        if status.ref_cnt < 0:
            new.insert(key, status, req_context)
            pending += 1
    old.clear()
    if req_context is not None:
        new.on_request_finished(req_context)
    return SwitchReport(len(drained) + kept, pinned, pending)


#: One entry of a recent-access log: the keys one ``touch`` call accessed (in order) under
#: its request's context, or ``None`` for keys where that request finished.
HistoryEntry = tuple[Sequence[OffloadKey] | None, ReqContext | None]


def warm_switch(
    old: CachePolicy,
    new: CachePolicy,
    history: Iterable[HistoryEntry],
    resident_keys: Iterable[OffloadKey] | None = None,
    req_context: ReqContext | None = None,
) -> SwitchReport:
    """:func:`switch_resident_set`, with ``new`` first replaying the recent accesses in
    ``history``, so it switches in with the state it would have learned serving them.

    A policy built at the switch knows nothing the old one learned: its ghosts, frequencies
    and reuse classes start empty, and it decides badly for as long as they take to fill (on
    the shared trace at 10%, ``kvaware`` switched in at 40% ended below ``mq``, the policy it
    replaced). The replay drives ``new`` as the manager would (each call's keys touched at
    once, the misses stored as a batch with the call's keys protected and completed at once),
    constrained to end on the
    real resident set: resident blocks the log does not access enter first (in ``old``'s
    eviction order), and every resident block is held pinned while the log plays, so only
    blocks that are not resident are evicted (its ghosts remember them). At the end those are
    evicted, and the resident blocks are released least recently accessed first (``old``'s
    order for the ones the log did not access), into their real pin state: ready ones made
    evictable, pinned ones kept pinned, pending ones entered again as pending stores.
    Resident blocks enter under their own status objects (the pin counts are saved and
    restored), so no status object changes hands; contexts are copied per request, so no
    policy state lands in the callers' contexts. Raises as :func:`switch_resident_set` does,
    before anything changes.
    """
    from kvoffload.policies.shadow import copy_context  # shadow imports factory: no cycle here

    statuses, keys = _resident(old, new, resident_keys)
    log = list(history)
    accessed: set[OffloadKey] = set()
    for entry_keys, _ in log:
        if entry_keys is not None:
            accessed.update(entry_keys)
    drained = drain_in_eviction_order(old)
    order = [key for key, _ in drained]  # least valuable first, then what old kept
    order_set = set(order)
    order += [key for key in keys if key in statuses and key not in order_set]
    saved = {key: status.ref_cnt for key, status in statuses.items()}
    last_use: dict[OffloadKey, int] = {}
    held: set[OffloadKey] = set()
    capacity = new.cache_capacity
    get, touch, evict = new.get, new.touch, new.evict
    step = replayed = 0

    pinned_keys: set[OffloadKey] = set()  # resident blocks entered (pinned until the end)

    def enter(key: OffloadKey, status: BlockStatus, ctx: ReqContext | None) -> None:
        _insert_ready(new, key, status, ctx)
        held.add(key)
        if key in statuses:  # resident: pinned while the log plays
            status.ref_cnt = 1
            new.mark_non_evictable(key)
            pinned_keys.add(key)

    # The blocks the log does not access were stored before it: enter them at its start time.
    first = next((ctx for _, ctx in log if ctx is not None and ctx.timestamp is not None), None)
    early = req_context
    if first is not None:
        early = ReqContext(req_id="warm-switch", timestamp=first.timestamp)
    try:
        for key in order:
            if key not in accessed:
                enter(key, statuses[key], early)
                last_use[key] = step
                step += 1
        copies: dict[int, ReqContext] = {}
        fake_ids = count(-2, -1)  # slots no real block has
        for entry_keys, ctx in log:
            mctx = None
            if ctx is not None:
                mctx = copies.get(id(ctx))
                if mctx is None:
                    mctx = copies[id(ctx)] = copy_context(ctx)
                    mctx.output_tokens = None
            if entry_keys is None:
                if ctx is not None and mctx is not None:
                    del copies[id(ctx)]
                    mctx.output_tokens = ctx.output_tokens
                    new.on_request_finished(mctx)
                continue
            # One call as the manager makes it: every key touched at once, then the misses
            # stored as a batch, room made with the call's keys protected.
            touch(entry_keys, mctx)
            misses = []
            for key in entry_keys:
                if key in statuses:
                    last_use[key] = step
                step += 1
                if get(key) is None:
                    misses.append(key)
            if not misses:
                continue
            fresh = [key for key in misses if key not in statuses]
            need = len(held) - len(pinned_keys) + len(fresh) - capacity
            if need > 0:  # the resident blocks count apart: they are pinned
                victims = evict(need, set(entry_keys))
                if victims is None:  # the call's own keys fill the capacity: store what fits
                    fresh = fresh[: max(len(fresh) - need, 0)]
                    keep = set(fresh)
                    misses = [key for key in misses if key in statuses or key in keep]
                else:
                    for victim, _ in victims:
                        held.discard(victim)
            for key in misses:
                status = statuses.get(key)
                if status is None:
                    status = BlockStatus(next(fake_ids))
                else:
                    replayed += 1
                enter(key, status, mctx)
        extra = [key for key in held if key not in statuses]
        if extra:
            victims = evict(len(extra), ()) or []  # the resident ones are pinned
            for victim, _ in victims:
                held.discard(victim)
            for key in extra:
                if key in held:  # cannot happen: evict gives every unpinned block
                    new.remove(key)
                    held.discard(key)
        missing = [key for key in order if key not in held]  # resident, never entered
        for key in missing:
            enter(key, statuses[key], req_context)
            last_use[key] = step
            step += 1
    except BaseException:
        for key, status in statuses.items():
            status.ref_cnt = saved[key]
        raise
    evictable = pinned = pending = 0
    released = sorted(held, key=last_use.__getitem__)
    for key in released:
        status = statuses[key]
        real = saved[key]
        if real == 0:
            status.ref_cnt = 0
            new.mark_evictable(key)
            evictable += 1
        elif real > 0:
            status.ref_cnt = real
            pinned += 1
        else:  # being written: enter again as a pending store
            new.remove(key)
            status.ref_cnt = -1
            new.insert(key, status, req_context)
            pending += 1
    old.clear()
    if req_context is not None:
        new.on_request_finished(req_context)
    return SwitchReport(evictable, pinned, pending, replayed)


def _resident(
    old: CachePolicy, new: CachePolicy, resident_keys: Iterable[OffloadKey] | None
) -> tuple[dict[OffloadKey, BlockStatus], list[OffloadKey]]:
    """The stored keys' statuses and the keys; ``ValueError`` when a switch cannot be made."""
    if not isinstance(old, CachePolicy) or not isinstance(new, CachePolicy):
        raise TypeError("old and new must be CachePolicy instances")
    if old is new:
        raise ValueError("old and new must be different policy objects")
    table = old.block_table
    if resident_keys is not None:
        keys = list(dict.fromkeys(resident_keys))
    elif table is not None:
        keys = list(table)
    else:
        raise ValueError(
            f"{type(old).__name__} keeps no block_table: pass resident_keys (every stored key)"
        )
    if any(new.get(key) is not None for key in keys) or (
        new.block_table is not None and len(new.block_table) > 0
    ):
        raise ValueError("new must be an empty policy (build a fresh one)")
    if len(keys) > new.cache_capacity:
        raise ValueError(
            f"new holds {new.cache_capacity} blocks, fewer than the {len(keys)} stored"
        )
    statuses: dict[OffloadKey, BlockStatus] = {}
    for key in keys:
        status = old.get(key)
        if status is not None:
            statuses[key] = status
    return statuses, keys


def _insert_ready(
    policy: CachePolicy, key: OffloadKey, status: BlockStatus, ctx: ReqContext | None
) -> None:
    """Enter ``key`` as a completed store: inserted as being written, then made evictable."""
    status.ref_cnt = -1
    policy.insert(key, status, ctx)
    status.ref_cnt = 0
    policy.mark_evictable(key)


__all__ = [
    "HistoryEntry",
    "SwitchReport",
    "drain_in_eviction_order",
    "switch_resident_set",
    "warm_switch",
]
