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

With ``warmed=True``, ``new`` may already hold some of the resident blocks, under their own
status objects and in their real state (what :func:`warm_from_history` leaves): those stay where
they are and only the others move, in the order above, after them.

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
    warm: int = 0  # blocks a warmed ``new`` held already (not moved)

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
    warmed: bool = False,
) -> SwitchReport:
    """Move every block stored in ``old`` into the empty policy ``new`` (see module docstring).

    Raises ``ValueError`` when ``new`` already stores blocks (with ``warmed``: any block that
    is not one of ``old``'s under the same status object) or is smaller than the resident
    set, or when ``old`` keeps no block table and ``resident_keys`` is not given; in those
    cases nothing has changed. ``req_context`` is passed to every call on ``new`` (give one
    with the current ``timestamp`` to a policy that keeps time by it, e.g. ``kvaware``); its
    ``on_request_finished`` is called at the end.
    """
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
    if len(keys) > new.cache_capacity:
        raise ValueError(
            f"new holds {new.cache_capacity} blocks, fewer than the {len(keys)} stored"
        )
    statuses: dict[OffloadKey, BlockStatus] = {}
    for key in keys:
        status = old.get(key)
        if status is not None:
            statuses[key] = status
    held = _held_already(new, statuses, warmed)
    drained = drain_in_eviction_order(old)
    moved = set(held)
    touch = new.touch
    evictable = 0
    for key, status in drained:
        if key in moved:  # a warmed new holds it already, in its own place
            continue
        evictable += 1
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
    return SwitchReport(evictable + kept, pinned, pending, len(held))


def _held_already(
    new: CachePolicy, statuses: Mapping[OffloadKey, BlockStatus], warmed: bool
) -> set[OffloadKey]:
    """The resident keys ``new`` holds already; ``ValueError`` if it holds anything else."""
    table = new.block_table
    if not warmed:
        if (table is not None and len(table) > 0) or any(
            new.get(key) is not None for key in statuses
        ):
            raise ValueError("new must be an empty policy (build a fresh one)")
        return set()
    held = {key for key, status in statuses.items() if new.get(key) is status}
    if (table is not None and len(table) != len(held)) or any(
        new.get(key) is not None for key in statuses.keys() - held
    ):
        raise ValueError(
            "a warmed new policy may hold only resident blocks, under their own status objects"
        )
    return held


#: One entry of a recent-history log: the keys one ``touch`` call accessed (in order) under
#: its request's context, or ``None`` for keys where that request finished.
HistoryEntry = tuple[Sequence[OffloadKey] | None, ReqContext | None]


def warm_from_history(
    new: CachePolicy,
    history: Iterable[HistoryEntry],
    resident: Mapping[OffloadKey, BlockStatus],
) -> int:
    """Replay a recent access log into the empty policy ``new``, then leave it holding only
    resident blocks (in their real state), so it switches in with learned history.

    A policy built at the switch knows nothing the old one learned: its ghosts, frequencies
    and reuse classes start empty, and it decides badly for as long as they take to fill (on
    the shared trace, ``kvaware`` switched in at 40% ended below the policy it replaced).
    Replaying the log (the shadow miniatures' protocol: each access touched, a miss inserted
    and completed at once, evicting one block when full) rebuilds that state as if ``new`` had
    served the window. Then the blocks it holds that are not resident are evicted (its ghosts
    remember them), and the resident ones it holds are given back their real pin state; the
    resident blocks it does not hold are left for :func:`switch_resident_set` with
    ``warmed=True``. Resident blocks enter the replay under their own status objects (pin
    counts saved and restored), so no status object changes hands. Contexts are copied per
    request, so no policy state lands in the callers' contexts. Returns the blocks kept.
    """
    from kvoffload.policies.shadow import copy_context  # shadow imports factory: no cycle here

    capacity = new.cache_capacity
    if capacity <= 0:
        return 0
    saved = {key: status.ref_cnt for key, status in resident.items()}
    held: dict[OffloadKey, BlockStatus] = {}
    copies: dict[int, ReqContext] = {}
    fake_ids = count(-2, -1)  # slots no real block has
    get, touch, evict, insert = new.get, new.touch, new.evict, new.insert
    mark_evictable = new.mark_evictable
    try:
        for keys, ctx in history:
            mctx = None
            if ctx is not None:
                mctx = copies.get(id(ctx))
                if mctx is None:
                    mctx = copies[id(ctx)] = copy_context(ctx)
                    mctx.output_tokens = None
            if keys is None:
                if ctx is not None and mctx is not None:
                    del copies[id(ctx)]
                    mctx.output_tokens = ctx.output_tokens
                    new.on_request_finished(mctx)
                continue
            for key in keys:
                one = [key]
                touch(one, mctx)
                if get(key) is not None:
                    continue
                if len(held) >= capacity:
                    victims = evict(1, one)
                    if not victims:
                        continue
                    for victim, _ in victims:
                        del held[victim]
                status = resident.get(key)
                if status is None:
                    status = BlockStatus(next(fake_ids), -1)
                status.ref_cnt = -1
                insert(key, status, mctx)
                status.ref_cnt = 0
                mark_evictable(key)
                held[key] = status
        extra = [key for key in held if key not in resident]
        if extra:
            keep = held.keys() - set(extra)
            victims = evict(len(extra), keep) or []
            for victim, _ in victims:
                held.pop(victim, None)
            for key in extra:  # what evict would not give (cannot happen without pins)
                if key in held:
                    new.remove(key)
                    del held[key]
    finally:
        for key, status in resident.items():
            status.ref_cnt = saved[key]
    for key, status in held.items():
        if status.ref_cnt > 0:
            new.mark_non_evictable(key)
        elif status.ref_cnt < 0:  # being written: re-enter as a pending store
            new.remove(key)
            new.insert(key, status, None)
    return len(held)


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
    "warm_from_history",
]
