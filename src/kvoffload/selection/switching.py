"""Warm switching: a new policy replays the recent accesses before it takes the resident set.

The move itself (:func:`~kvoffload.policies.switching.switch_resident_set`, the blocks in the
old policy's eviction order, pins and pending writes kept) is at the policies' floor (a
manager's ``switch_policy`` makes it through its ledger); :func:`warm_switch` is selection's:
``auto`` calls it when its shadows favour another candidate. The move's names are
re-exported here, so everything about switching is reachable from :mod:`kvoffload.selection`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import count

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.switching import (
    SwitchReport,
    drain_in_eviction_order,
    insert_ready,
    resident_statuses,
    switch_resident_set,
)
from kvoffload.selection.shadow import copy_context

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
    statuses, keys = resident_statuses(old, new, resident_keys)
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
        insert_ready(new, key, status, ctx)
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


__all__ = [
    "HistoryEntry",
    "SwitchReport",
    "drain_in_eviction_order",
    "switch_resident_set",
    "warm_switch",
]
