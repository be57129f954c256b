"""The simulator's blocks mode: every block an independent access, made fast.

:func:`access_blocks` treats each key of a request as one access, in order, in one call
(libCacheSim's model): a HIT is loaded (``prepare_load`` + ``complete_load``), a MISS is
stored (``prepare_store`` + ``complete_store``), a HIT_PENDING is left alone. It makes the
same policy calls and leaves the same counters, slots and statuses as that per-key call
sequence (``tests/sim/test_drive.py`` checks it), without its per-call cost: the blocks mode
is bound by it. It works on the manager's driver parts (``pool``, ``counters``,
``status_getter``, ``touches_misses``, ``request_record``); with admission filters, events,
shadow policies or a recorder on, it makes exactly the public calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import BlockAccesses, CPUOffloadingManager, LookupResult

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING


def access_blocks(
    m: CPUOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> BlockAccesses:
    """Each of ``keys`` as an independent access to ``m``, in order (see the module)."""
    if (
        m.admission is not None
        or m.events_enabled
        or m.shadows is not None
        or m.recorder is not None
    ):
        return access_blocks_by_calls(m, keys, ctx)
    record = m.request_record(ctx)
    touched = record.touched
    policy = m.policy
    # Single-key hooks: the contract makes them equal to the batch ones with one key.
    touch, evict, insert = policy.touch, policy.evict, policy.insert
    mark_non_evictable, mark_evictable = policy.mark_non_evictable, policy.mark_evictable
    get = m.status_getter
    pool = m.pool
    take = pool.take
    available = pool.capacity - pool.next_fresh + len(pool.free)
    evictable = pool.num_evictable
    touch_misses = m.touches_misses
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
        if available:
            status = take()
            available -= 1
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
    pool.num_evictable = evictable
    counters = m.counters
    counters.misses += len(results) - hits - pending
    counters.hits += hits
    counters.hits_pending += pending
    counters.loads += hits
    counters.stores_prepared += stored
    counters.stores_completed += stored
    counters.evictions += evicted
    counters.failed_allocations += failed
    return BlockAccesses(results, stored, evicted, failed)


def access_blocks_by_calls(
    m: CPUOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> BlockAccesses:
    """:func:`access_blocks` made of the public calls (admission filters and events need
    them; it is also the definition the fast path is tested against)."""
    results: list[LookupResult] = []
    stored = evicted = failed = 0
    for key in keys:
        result = m.lookup(key, ctx)
        results.append(result)
        one = [key]
        if result is _HIT:
            m.prepare_load(one, ctx)
            m.complete_load(one, ctx)
        elif result is _MISS:
            out = m.prepare_store(one, ctx)
            if out is None:
                failed += 1
            elif out.keys_to_store:
                m.complete_store(out.keys_to_store, ctx)
                stored += 1
                evicted += len(out.evicted_keys)
    return BlockAccesses(results, stored, evicted, failed)


__all__ = ["access_blocks", "access_blocks_by_calls"]
