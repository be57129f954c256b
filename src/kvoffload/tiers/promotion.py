"""A tiering manager's lookups and promotions: where a key is, and reading it into the CPU.

Only the contiguous prefix is promoted (:meth:`TierPromotions.lookup_prefix`), and only as far
as the load-or-recompute plan says (:class:`~kvoffload.tiers.costs.LoadDecider`). Why apart:
the manager's completion, store and reset paths call into these, but none of them decides what
is promoted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import LookupResult
from kvoffload.tiers.base import JobKind, Presence
from kvoffload.tiers.costs import CPU_TIER, LoadDecider, LoadPlan
from kvoffload.tiers.tiering_state import RequestState, TierState, request_state
from kvoffload.tiers.write_policies import TierWrites

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING
_RETRY = LookupResult.RETRY


class TierPromotions(TierWrites):
    """The lookup and promotion side of ``TieringManager`` (its base; the manager owns the
    state)."""

    costs: LoadDecider
    negative_ttl_s: float
    _clock: Callable[[], float]
    _max_negative: int

    def note_overdue(self, ctx: ReqContext) -> int:
        """``ctx`` stopped waiting for its reads: each one still in flight has taken at least
        its age so far, which the tier's estimate learns now, as a lower bound
        (:meth:`~kvoffload.tiers.costs.LinearCost.observe_floor`), rather than only when it
        completes: the next request already plans with it. Returns how many reads were noted."""
        now, noted = time.monotonic(), 0
        for st in self._tiers:
            for job in st.jobs.values():
                if job.ctx is ctx and job.kind is JobKind.GET and job.submitted and not job.overdue:
                    job.overdue = True
                    st.costs.read.observe_floor(job.nbytes, now - job.submitted)
                    noted += 1
        return noted

    def request_plan(self, ctx: ReqContext) -> LoadPlan | None:
        """The plan of ``ctx``'s last :meth:`lookup_prefix` (``None``: no decision was made)."""
        state = ctx.get_state(RequestState)
        return state.plan if state is not None else None

    def _negative(self, st: TierState, key: OffloadKey) -> None:
        if not self._max_negative:
            return
        st.negative[key] = self._clock() + self.negative_ttl_s
        st.negative.move_to_end(key)
        while len(st.negative) > self._max_negative:
            st.negative.popitem(last=False)

    def _refused(self, st: TierState, key: OffloadKey) -> bool:
        """True while a failed read's verdict holds ``key`` back from ``st`` (expired: gone)."""
        expiry = st.negative.get(key)
        if expiry is None:
            return False
        if self._clock() < expiry:
            return True
        del st.negative[key]
        return False

    # ----------------------------------------------------------------- lookup
    def _locate(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> list[tuple[LookupResult, int]]:
        """For keys not in the CPU: (HIT, tier) / (RETRY, -1) / (MISS, -1), tiers in order."""
        found: list[int] = [-1] * len(keys)
        unknown: list[int] = [-1] * len(keys)  # first tier that answered UNKNOWN
        todo = list(range(len(keys)))
        for index, st in enumerate(self._tiers):
            if not todo:
                break
            if not st.breaker.allows():
                continue
            asked = [keys[i] for i in todo]
            st.counters["lookups"] += len(asked)
            began = time.monotonic()
            presence = st.tier.contains(asked)
            st.costs.histograms["lookup"].observe(time.monotonic() - began)
            left = []
            for i, verdict in zip(todo, presence, strict=True):
                if verdict is Presence.HIT and not self._refused(st, keys[i]):
                    found[i] = index
                    st.counters["hits"] += 1
                else:
                    if verdict is Presence.UNKNOWN and unknown[i] < 0:
                        unknown[i] = index
                        st.counters["unknown"] += 1
                    left.append(i)
            todo = left
        out = [(_HIT, index) if index >= 0 else (_MISS, -1) for index in found]
        for i, index in enumerate(unknown):
            if index < 0 or found[i] >= 0:
                continue
            retries = request_state(ctx).retries  # made only once some tier did not know a key
            tries = retries.get(keys[i], 0)
            if tries < self._tiers[index].spec.lookup_retries:
                retries[keys[i]] = tries + 1
                self._counters["retries"] += 1
                out[i] = (_RETRY, -1)
        return out

    def _allocate(
        self,
        keys: list[OffloadKey],
        tiers: list[int],
        ctx: ReqContext,
        prefix: Sequence[OffloadKey] = (),
    ) -> int:
        """Give promoted ``keys`` CPU slots and queue their reads; returns how many (a prefix).

        ``prefix`` is the request's whole prefix (``keys`` among it): offered with them, its
        CPU-resident blocks are protected, so a promotion never evicts the prefix it extends.
        """
        cut = len(keys)
        wanted: Counter[int] = Counter()
        for i, index in enumerate(tiers):
            st = self._tiers[index]
            wanted[index] += 1
            room = st.room(self.slot_bytes)
            if room is not None and room < wanted[index]:
                self._drop(st, "promotion_inflight_limit", 1)
                cut = i
                break
        keys, tiers = keys[:cut], tiers[:cut]
        if not keys:
            return 0
        # Only the keys read below may get slots: a key the bound cut off (or a prefix key
        # evicted since it was seen) would otherwise hold a pending slot no read completes.
        promoted = set(keys)
        slot_of = self.cpu.slot_of
        offered = [k for k in prefix if k in promoted or slot_of(k) is not None] if prefix else keys
        if not self._make_room(keys, offered):
            self._counters["promotion_allocation_failures"] += 1
            return 0
        # A promotion is not a store: the CPU's store admission does not veto it.
        out = self.cpu.reserve_promotion(offered, ctx)
        if out is None:
            self._counters["promotion_allocation_failures"] += 1
            return 0
        slots = dict(zip(out.keys_to_store, out.store_spec.block_ids, strict=True))
        # A partial store (or a key stored meanwhile) cuts them at the first key without a slot.
        kept = next((i for i, key in enumerate(keys) if key not in slots), len(keys))
        if kept < len(keys):
            self._counters["promotions_cut"] += 1
        read = set(keys[:kept])
        unread = [k for k in out.keys_to_store if k not in read]
        if unread:  # slots no read will fill: released now, never left pending
            self.cpu.complete_promotion(unread, success=False)
        for key, index in zip(keys[:kept], tiers[:kept], strict=True):
            self._tiers[index].queue.append((key, slots[key], ctx))
        return kept

    def lookup(self, key: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        """CPU first, then the secondaries; a secondary hit starts a promotion (``HIT_PENDING``).

        Promotions found by single-key lookups are batched until the next :meth:`step`, store,
        full miss, or a lookup that asks again about a block still queued.
        """
        self._reap()
        if self._resetting:
            return _MISS
        result = self.cpu.lookup(key, ctx)
        if not self._tiers:
            return result
        owner = ctx if ctx is not None else self._internal
        seen = request_state(owner).seen
        if result is not _MISS:
            if key in seen:  # the driver starts a new pass over its prefix
                seen.clear()
                self._flush()
            seen[key] = None
            return result
        verdict, index = self._locate([key], owner)[0]
        if verdict is _HIT:
            # Offered with the pass's CPU-resident prefix, so the promotion cannot evict it.
            if self._allocate([key], [index], owner, [*seen, key]):
                seen[key] = None
                return _HIT_PENDING
            verdict = _MISS
        seen.clear()
        if verdict is _MISS:
            self._flush()  # the prefix ends here
        return verdict

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], ctx: ReqContext | None = None
    ) -> list[LookupResult]:
        """Each key's result for a request's prefix, promoting the contiguous hit prefix.

        The walk stops at the first key found nowhere (MISS) or not known yet (RETRY); keys
        after it are ``MISS`` without being asked. Blocks found in secondaries get CPU slots
        and are read by one job per tier, submitted now.
        """
        self._reap()
        results = [_MISS] * len(keys)
        if self._resetting or not keys:
            return results
        owner = ctx if ctx is not None else self._internal
        slot_of = self.cpu.slot_of
        absent = [k for k in keys if slot_of(k) is None]
        located = dict(zip(absent, self._locate(absent, owner), strict=True)) if self._tiers else {}
        promote: dict[OffloadKey, int] = {}  # hit key -> its position in keys
        hit_tiers: list[int] = []  # the tier of each prefix block (CPU_TIER: resident)
        stop = len(keys)
        end = _MISS  # the verdict of the key that ends the prefix
        for i, key in enumerate(keys):
            if slot_of(key) is not None:
                hit_tiers.append(CPU_TIER)
                continue
            verdict, index = located.get(key, (_MISS, -1))
            if key in promote:  # a repeated key: already part of the prefix
                hit_tiers.append(hit_tiers[promote[key]])
                continue
            if verdict is _HIT:
                promote[key] = i
                hit_tiers.append(index)
                continue
            stop, end = i, verdict
            break
        walked = stop  # the prefix found, before the plan cuts it
        chosen = probe = False
        state = request_state(owner)
        if hit_tiers and owner.prompt_tokens and self.costs.enabled:
            # A driver asks again while its promotions land: its choice is counted once.
            plan = self.costs.plan(
                hit_tiers, owner.prompt_tokens, self.slot_bytes, count=state.plan is None
            )
            state.plan = plan
            probe = plan.probe
            if plan.load_blocks < len(hit_tiers):  # the rest is recomputed sooner than read
                stop, end, chosen = plan.load_blocks, _MISS, True
                if not probe:  # a probe reads them all; the request waits for none
                    promote = {key: at for key, at in promote.items() if at < stop}
        if promote:
            # Offered with the prefix they extend (a probe's: all of it), so they evict none of it.
            prefix = keys[:walked] if probe else keys[:stop]
            promote_at = list(promote.values())
            kept = self._allocate(list(promote), [hit_tiers[i] for i in promote_at], owner, prefix)
            if kept < len(promote_at) and promote_at[kept] < stop:  # no room (or not admitted)
                stop, end = promote_at[kept], _MISS  # the prefix ends there
            self._flush()
        for i in range(stop):
            results[i] = self.cpu.lookup(keys[i], ctx)
        if stop < len(keys):
            results[stop] = end
            if end is _MISS and not chosen:  # count the miss that ends the prefix, as a driver does
                self.cpu.lookup(keys[stop], ctx)
        return results

    # ------------------------------------------------------------------ moves
    def _flush(self) -> None:
        """Submit every queued promotion: one job per tier (split by its ``max_batch``)."""
        for st in self._tiers:
            if not st.queue:
                continue
            queue, st.queue = st.queue, []
            by_ctx: dict[int, list[tuple[OffloadKey, int, ReqContext]]] = {}
            for item in queue:
                by_ctx.setdefault(id(item[2]), []).append(item)
            for items in by_ctx.values():
                keys = [k for k, _, _ in items]
                slots = [s for _, s, _ in items]
                self._submit(st, JobKind.GET, keys, slots, items[0][2], "promote")


__all__ = ["TierPromotions"]
