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

:func:`kvoffload.selection.switching.warm_switch` does the same move after replaying a recent
access log into ``new``, so that it starts with the state (ghosts, frequencies, reuse classes)
it would have learned. The move is here, at the policies' floor, for two bare policies; a
manager's ``switch_policy`` makes the same calls through its ledger
(:meth:`kvoffload.manager.ledger.BlockLedger.replace_policy`, with this module's drain and
checks); choosing a policy and warming it up is selection's (:mod:`kvoffload.selection`,
above the manager).

The blocks' :class:`BlockStatus` objects move as they are (they are shared with the manager),
so slots and pin counts are unchanged. The old policy is cleared at the end: it is consumed.
The keys of pinned and pending blocks come from the old policy's ``block_table`` or, when it
keeps none, from ``resident_keys`` (every stored key; the manager knows them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvoffload._moved import moved_names
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
    statuses, _ = resident_statuses(old, new, resident_keys)
    drained = drain_in_eviction_order(old)
    moved = set()
    touch = new.touch
    for key, status in drained:
        moved.add(key)
        insert_ready(new, key, status, req_context)
        if frequencies is not None:
            extra = frequencies.get(key, 1) - 1
            one = [key]
            for _ in range(extra):
                touch(one, req_context)
    pinned = pending = kept = 0
    rest = [(key, status) for key, status in statuses.items() if key not in moved]
    for key, status in rest:  # ready blocks old would not give up (its own pins): keep them
        if status.ref_cnt == 0:
            insert_ready(new, key, status, req_context)
            kept += 1
    for key, status in rest:
        if status.ref_cnt > 0:
            count = status.ref_cnt
            insert_ready(new, key, status, req_context)
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


def resident_statuses(
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


def insert_ready(
    policy: CachePolicy, key: OffloadKey, status: BlockStatus, ctx: ReqContext | None
) -> None:
    """Enter ``key`` as a completed store: inserted as being written, then made evictable."""
    status.ref_cnt = -1
    policy.insert(key, status, ctx)
    status.ref_cnt = 0
    policy.mark_evictable(key)


#: ``warm_switch`` and ``HistoryEntry`` moved to :mod:`kvoffload.selection.switching` (above
#: this floor): deprecated aliases, with a warning.
__getattr__ = moved_names(
    __name__, "kvoffload.selection.switching", ("warm_switch", "HistoryEntry")
)


__all__ = [
    "SwitchReport",
    "drain_in_eviction_order",
    "insert_ready",
    "resident_statuses",
    "switch_resident_set",
]
