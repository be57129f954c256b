"""The block ledger: one policy and its slots, and the only code that moves a block's status.

Every holder of blocks (the CPU manager, the simulator's blocks mode, the policy test driver)
keeps its blocks here, so the manager-policy protocol is written once:

* a block's status goes ``reserve`` (pending, ``ref_cnt == -1``) -> :meth:`BlockLedger.complete`
  (ready, 0) <-> :meth:`BlockLedger.pin` / :meth:`BlockLedger.unpin` (pinned, > 0);
  :meth:`BlockLedger.fail` removes a pending block, and an eviction frees a ready one;
* the policy's mark hooks are called exactly at the 0-edges (``mark_non_evictable`` when a
  ready block's first pin arrives, ``mark_evictable`` when a block becomes ready or its last
  pin goes), and nowhere else.

The ledger checks nothing a caller's bug could break: callers validate keys and requests
first (the manager does, with messages in its own words).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager.api import LookupResult
from kvoffload.manager.pool import SlotPool
from kvoffload.policies import BlockStatus, CachePolicy, SwitchReport, Victims
from kvoffload.policies.switching import switch_resident_set

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING


class EachAccess(NamedTuple):
    """What :meth:`BlockLedger.access_each` did: each key's lookup result and the counts."""

    results: list[LookupResult]
    hits: int  # ready blocks found (touched, and pinned for a moment when asked)
    pending: int  # blocks found being written (left alone)
    stored: int  # misses stored (their writes completed at once)
    evicted: int  # blocks evicted to make room
    failed: int  # misses that found no room

    @property
    def misses(self) -> int:
        return len(self.results) - self.hits - self.pending


class BlockLedger:
    """A policy and its slots (see the module): the status edges and the counts by state.

    ``get`` is ``key -> BlockStatus | None`` (pure): the policy's table's C-level ``get`` when
    it keeps one. Rebind with :meth:`bind` when the policy is replaced or cleared.
    """

    __slots__ = ("get", "policy", "pool", "table", "touches_misses")

    def __init__(self, policy: CachePolicy, capacity: int) -> None:
        self.pool = SlotPool(capacity)
        self.bind(policy)

    def bind(self, policy: CachePolicy) -> None:
        """Take ``policy`` (a new one after a switch, or the same after ``clear``)."""
        self.policy = policy
        table = policy.block_table
        self.table: dict[OffloadKey, BlockStatus] | None = (
            table if isinstance(table, dict) else None
        )
        self.get: Callable[[OffloadKey], BlockStatus | None] = (
            table.get if table is not None else policy.get
        )
        self.touches_misses = policy.touches_misses  # exact: CachePolicy.__init_subclass__

    # ------------------------------------------------------------------ gauges
    @property
    def num_free(self) -> int:
        """Slots a store can take without evicting."""
        pool = self.pool
        return pool.capacity - pool.next_fresh + len(pool.free)

    @property
    def num_evictable(self) -> int:
        return self.pool.num_evictable

    def evictable_among(self, keys: Iterable[OffloadKey]) -> int:
        """How many of ``keys`` are ready and unpinned (protected ones a store cannot evict)."""
        get = self.get
        count = 0
        for key in keys:
            status = get(key)
            if status is not None and status.ref_cnt == 0:
                count += 1
        return count

    # ------------------------------------------------------------------ accesses
    def access(
        self, touched: set[OffloadKey] | None, keys: Iterable[OffloadKey], ctx: ReqContext | None
    ) -> list[OffloadKey]:
        """Touch the keys the request has not accessed yet (each once, in order); return them.

        ``touched`` is the request's set of accessed keys (``None``: no request, every key
        is touched).
        """
        if touched is None:
            fresh = list(keys)
        elif not touched:
            fresh = list(keys)
            touched.update(fresh)
            if len(touched) != len(fresh):  # a key repeated in the call
                fresh = list(dict.fromkeys(fresh))
        else:
            fresh = []
            for key in keys:
                if key not in touched:
                    touched.add(key)
                    fresh.append(key)
        if fresh:
            self.policy.touch(fresh, ctx)
        return fresh

    # ------------------------------------------------------------------ stores
    def make_room(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        """Evict what it takes for ``n`` free slots, none of ``protected``; the victims' keys
        (``[]``: room enough), or ``None`` when the policy could not (nothing changed)."""
        need = n - self.num_free
        if need <= 0:
            return []
        victims = self.policy.evict(need, protected)
        if victims is None:
            return None
        keys, statuses = zip(*victims, strict=True)
        self.pool.free.extend(statuses)  # victims are ready and unpinned: ref_cnt 0
        self.pool.num_evictable -= len(victims)
        return list(keys)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        """Evict ``n`` ready blocks (none of ``protected``), their slots free; the victims,
        or ``None`` when the policy could not (nothing changed)."""
        victims = self.policy.evict(n, protected)
        if victims is not None:
            self.pool.free.extend(status for _, status in victims)  # ready, unpinned: 0
            self.pool.num_evictable -= len(victims)
        return victims

    def evict_held(
        self, n: int, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, BlockStatus]]:
        """Evict up to ``n`` blocks (none of ``protected``) whose slots stay held until
        ``pool.release_evicted`` (their bytes are being copied out); the victims."""
        count = min(n, self.pool.num_evictable - self.evictable_among(protected))
        if count <= 0:
            return []
        victims = self.policy.evict(count, protected)
        if victims is None:
            return []
        self.pool.num_evictable -= count
        self.pool.hold_evicted(status for _, status in victims)
        return victims

    def reserve(self, keys: Sequence[OffloadKey], ctx: ReqContext | None) -> list[BlockStatus]:
        """Insert ``keys`` (absent, at most ``num_free`` of them) as pending; their statuses."""
        statuses = self.pool.allocate(len(keys))
        self.policy.insert_many(keys, statuses, ctx)
        self.pool.num_pending += len(keys)
        return statuses

    def complete(self, keys: Sequence[OffloadKey]) -> None:
        """Pending ``keys`` were written: ready and evictable, marked in the order given."""
        get = self.get
        for key in keys:
            get(key).ref_cnt = 0  # type: ignore[union-attr]
        self.policy.mark_evictable_many(keys)
        pool = self.pool
        pool.num_pending -= len(keys)
        pool.num_evictable += len(keys)

    def fail(self, keys: Sequence[OffloadKey]) -> None:
        """Pending ``keys`` could not be written: removed, their slots free."""
        get = self.get
        remove = self.policy.remove
        release = self.pool.release
        for key in keys:
            status = get(key)
            remove(key)
            release((status,))  # type: ignore[arg-type]
        self.pool.num_pending -= len(keys)

    def insert_ready(self, key: OffloadKey) -> BlockStatus:
        """A block found ready (a restart's scan): it enters the policy ready and evictable,
        as a restored state's blocks do (no mark hook); its status."""
        (status,) = self.pool.allocate(1)
        status.ref_cnt = 0
        self.policy.insert(key, status)
        self.pool.num_evictable += 1
        return status

    def remove_ready(self, key: OffloadKey) -> bool:
        """Drop a ready, unpinned block (a delete, a corrupt record): its slot is free.
        False (nothing changed) when it is absent, pinned or being written."""
        status = self.get(key)
        if status is None or status.ref_cnt != 0:
            return False
        self.policy.remove(key)
        self.pool.release((status,))
        self.pool.num_evictable -= 1
        return True

    # ------------------------------------------------------------------ pins
    def pin(self, keys: Iterable[OffloadKey], statuses: Iterable[BlockStatus]) -> None:
        """Pin ready blocks (``statuses`` are ``keys``'), once per occurrence."""
        mark_non_evictable = self.policy.mark_non_evictable
        pinned_now = 0
        for key, status in zip(keys, statuses, strict=True):
            if status.ref_cnt == 0:
                mark_non_evictable(key)
                pinned_now += 1
            status.ref_cnt += 1
        self.pool.num_evictable -= pinned_now

    def unpin(self, keys: Iterable[OffloadKey]) -> None:
        """Drop one pin of each of ``keys`` (pinned), in order; the last pin makes a block
        evictable again."""
        get = self.get
        released: list[OffloadKey] = []
        for key in keys:
            status = get(key)
            if status is None or status.ref_cnt <= 0:  # cannot happen unless state was corrupted
                raise RuntimeError(f"unpin: key {key!r} is not pinned")
            status.ref_cnt -= 1
            if status.ref_cnt == 0:
                released.append(key)
        if released:
            self.policy.mark_evictable_many(released)
            self.pool.num_evictable += len(released)

    def drop_pin(self, key: OffloadKey) -> bool:
        """Drop one pin of a block that must go (found corrupt while read): at its last pin
        it is removed (never evictable again, so no mark hook) and its slot is free; True
        then."""
        status = self.get(key)
        if status is None or status.ref_cnt <= 0:  # cannot happen unless state was corrupted
            raise RuntimeError(f"drop_pin: key {key!r} is not pinned")
        status.ref_cnt -= 1
        if status.ref_cnt:
            return False
        self.policy.remove(key)
        self.pool.release((status,))
        return True

    # ------------------------------------------------------------------ resets
    def clear(self, generation: int) -> None:
        """Drop every block; the slots of jobs in flight stay held for ``generation``."""
        pool = self.pool
        expected = pool.num_pending + pool.num_pinned
        in_flight: list[BlockStatus] = []
        by_key: dict[OffloadKey, BlockStatus] | None = None
        if expected:
            table = self.table
            if table is not None:
                by_key = {}
                for key, status in table.items():
                    if status.ref_cnt:
                        by_key[key] = status
                        if len(by_key) == expected:
                            break
                in_flight = list(by_key.values())
            else:
                in_flight = pool.in_flight()
        self.policy.clear()
        self.bind(self.policy)
        pool.reset(generation, in_flight, by_key)

    def restore(self, statuses: list[BlockStatus]) -> None:
        """Start from a saved cache whose policy (already bound) holds ready blocks."""
        table: Mapping[OffloadKey, BlockStatus] | None = self.policy.block_table
        stored = [status.block_id for status in table.values()] if table is not None else []
        self.pool.restore(statuses, stored)

    # ------------------------------------------------------------------ switches
    def replace_policy(self, new: CachePolicy, ctx: ReqContext | None) -> SwitchReport:
        """Move every block into the empty policy ``new`` and take it; what moved.

        The move is :func:`~kvoffload.policies.switching.switch_resident_set` (its order is
        documented there): the statuses, so the slots, pins and the pool's counts, are
        unchanged; every call on ``new`` gets ``ctx``; the old policy is cleared. Raises
        before anything changes when ``new`` is not empty or is too small, or the old policy
        keeps no block table.
        """
        report = switch_resident_set(self.policy, new, req_context=ctx)
        self.bind(new)
        return report

    # ------------------------------------------------------------------ blocks mode
    def access_each(
        self,
        keys: Iterable[OffloadKey],
        ctx: ReqContext | None,
        touched: set[OffloadKey] | None = None,
        pin_hits: bool = True,
        touch_misses: bool | None = None,
    ) -> EachAccess:
        """Each of ``keys`` as one independent access, in order: a ready block is a hit
        (touched once per request; with ``pin_hits`` pinned and released at once, as a load
        is), a pending one is left alone, an absent one is touched (when the policy learns
        from misses, or ``touch_misses``), makes room for itself alone and is stored and
        completed. ``touched`` as in :meth:`access` (``None``: every access touches)."""
        policy = self.policy
        # Single-key hooks: the contract makes them equal to the batch ones with one key.
        touch, evict, insert = policy.touch, policy.evict, policy.insert
        mark_non_evictable, mark_evictable = policy.mark_non_evictable, policy.mark_evictable
        get = self.get
        pool = self.pool
        take = pool.take
        available = pool.capacity - pool.next_fresh + len(pool.free)
        evictable = pool.num_evictable
        if touch_misses is None:
            touch_misses = self.touches_misses
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
                if touched is None:
                    touch([key], ctx)
                elif key not in touched:
                    touched.add(key)
                    touch([key], ctx)
                if pin_hits and status.ref_cnt == 0:  # pinned and released: count unchanged
                    mark_non_evictable(key)
                    mark_evictable(key)
                continue
            results.append(_MISS)
            if not available and not evictable:  # nothing to evict: not even touched
                failed += 1
                continue
            if touch_misses:
                if touched is None:
                    touch([key], ctx)
                elif key not in touched:
                    touched.add(key)
                    touch([key], ctx)
            if available:
                status = take()
                available -= 1
            else:
                victims = evict(1, (key,))
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
        pool.num_evictable = evictable
        return EachAccess(results, hits, pending, stored, evicted, failed)


__all__ = ["BlockLedger", "EachAccess"]
