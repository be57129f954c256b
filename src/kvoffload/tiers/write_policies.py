"""A tiering manager's write policies: which CPU blocks go to which secondary tier, when.

``write_through`` puts a block to the tier as soon as it is ready in the CPU (the put pins its
slot); ``selective`` offers it to the tier's admission filter first; ``write_back`` writes a
block only when the CPU policy evicts it, holding its slot until every such tier has it (and
evicts ahead of need, so a store rarely waits). Why apart: the manager's lookup, completion
and reset paths call into these, but none of them decides what is written.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager
from kvoffload.tiers.base import JobKind, Presence
from kvoffload.tiers.settings import WritePolicy
from kvoffload.tiers.tiering_state import TierJobState, TierState


class TierWrites:
    """The write side of ``TieringManager`` (its base; the manager owns the state)."""

    cpu: CPUOffloadingManager
    slot_bytes: int
    write_back_wait_s: float
    _counters: dict[str, int]
    _evicting: dict[int, list[Any]]  # held victim slot -> [key, writes left]
    _generation: int
    _internal: ReqContext
    _resetting: bool
    _tiers: list[TierState]
    _write_back: list[TierState]
    _reap: Callable[[], int]  # applies the tiers' completions (a write-back waits on them)

    def _drop(self, st: TierState, reason: str, count: int) -> None:
        if count:
            st.drops[reason] += count

    def _write(
        self,
        st: TierState,
        keys: Sequence[OffloadKey],
        ctx: ReqContext,
        purpose: str,
        held: Mapping[OffloadKey, int] | None = None,
    ) -> list[OffloadKey]:
        """Put CPU-ready ``keys`` to ``st``; returns the keys submitted.

        ``held`` gives the slots of evicted victims (a write-back: the slots are held, and
        the put's completion releases them); otherwise the put pins the CPU blocks itself.
        """
        if self._resetting:
            self._drop(st, "resetting", len(keys))
            return []
        asked = [k for k in dict.fromkeys(keys) if k not in st.put_keys]
        presence = st.tier.contains(asked) if asked else []
        fresh = [k for k, p in zip(asked, presence, strict=True) if p is not Presence.HIT]
        st.counters["already_stored"] += len(asked) - len(fresh)
        if not fresh:
            return []
        if not st.breaker.allows():
            self._drop(st, "breaker_open", len(fresh))
            return []
        room = st.room(self.slot_bytes)
        if room is not None and room < len(fresh):
            self._drop(st, "inflight_limit", len(fresh) - room)
            fresh = fresh[:room]
            if not fresh:
                return []
        if held is not None:
            slots = [held[k] for k in fresh]
            st.write_backs += len(fresh)
        else:
            slots = self.cpu.pin_copy(fresh)  # not a load: no touch, no ``loads``
        self._submit(st, JobKind.PUT, fresh, slots, ctx, purpose, held is not None)
        return fresh

    def _submit(
        self,
        st: TierState,
        kind: JobKind,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        ctx: ReqContext,
        purpose: str,
        held: bool = False,
    ) -> None:
        """Submit a put or get of ``keys`` into/from ``slots`` to ``st``, in jobs of at most
        its ``max_batch`` keys; ``held``: the job keeps its slots (a write-back's victims)."""
        step = st.max_batch or len(keys)
        submit = st.tier.submit_get if kind is JobKind.GET else st.tier.submit_put
        for start in range(0, len(keys), step):
            part = tuple(keys[start : start + step])
            part_slots = slots[start : start + step]
            nbytes = len(part) * self.slot_bytes
            job_id = submit(part, part_slots, self._generation)
            st.breaker.on_submit()
            st.jobs[job_id] = TierJobState(
                kind,
                part,
                ctx,
                self._generation,
                nbytes,
                purpose,
                tuple(part_slots) if held else (),
                submitted=time.monotonic() if kind is JobKind.GET else 0.0,
            )
            st.inflight_bytes += nbytes
            if kind is JobKind.PUT:
                st.put_keys.update(part)

    def _cascade(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        """Blocks that just became ready in the CPU: hand them to each tier's write policy."""
        for st in self._tiers:
            if st.policy is WritePolicy.WRITE_THROUGH:
                self._write(st, keys, ctx, "write")
            elif st.policy is WritePolicy.SELECTIVE:
                self._offer(st, keys, ctx)

    def _offer(self, st: TierState, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        admission = st.admission
        if admission is None:  # cannot happen: selective tiers always get one
            raise RuntimeError("selective tier without an admission filter")
        asked = [k for k in keys if k not in st.put_keys]
        presence = st.tier.contains(asked) if asked else []
        candidates = [k for k, p in zip(asked, presence, strict=True) if p is not Presence.HIT]
        if not candidates:
            return
        admitted = admission.admit(candidates, ctx)
        self._drop(st, "admission", len(candidates) - len(admitted))
        if admitted:
            self._write(st, admitted, ctx, "write")

    def _make_room(self, keys: Sequence[OffloadKey], protected: Sequence[OffloadKey]) -> bool:
        """Before a CPU store of ``keys``: evict ahead what it lacks, so no victim of a
        write-back tier leaves unwritten. False: the store must wait for write-backs."""
        if not self._write_back or self._resetting:
            return True
        slot_of = self.cpu.slot_of
        new = sum(1 for k in dict.fromkeys(keys) if slot_of(k) is None)
        if new <= self.cpu.free_blocks:
            return True
        self._evict_ahead(new, protected)
        if self._evicting:
            self._reap()  # a tier that finished at once frees the slots now
        if new > self.cpu.free_blocks and self._evicting and self.write_back_wait_s > 0:
            deadline = time.monotonic() + self.write_back_wait_s
            for st in self._write_back:  # wait (bounded) for the writes that free the room
                if st.write_backs:
                    st.tier.drain(max(0.0, deadline - time.monotonic()))
            self._counters["write_back_waits"] += 1
            self._reap()
        if new > self.cpu.free_blocks and self._evicting:
            self._counters["stores_waiting_write_back"] += 1
            return False
        return True  # enough room, or nothing left to evict (the CPU store decides)

    def _evict_ahead(self, wanted: int, protected: Sequence[OffloadKey]) -> None:
        """Evict the CPU policy's next victims until ``wanted`` slots are free or held, writing
        them to the write-back tiers; a victim's slot is held until every tier it went to has it."""
        short = wanted - self.cpu.free_blocks - len(self._evicting)
        if short <= 0:
            return
        victims = self.cpu.evict_ahead(short, protected)
        if not victims:
            return
        self._counters["evicted_ahead"] += len(victims)
        keys = [key for key, _ in victims]
        held = dict(victims)
        writes: Counter[OffloadKey] = Counter()
        for st in self._write_back:
            writes.update(self._write(st, keys, self._internal, "write_back", held=held))
        free = []
        for key, slot in victims:
            if writes[key]:
                self._evicting[slot] = [key, writes[key]]
            else:  # stored there already, or dropped (counted): nothing to wait for
                free.append(slot)
        if free:
            self.cpu.release_evicted(free)

    def _release_written(self, slots: Sequence[int]) -> None:
        """A write-back put finished (either way): victims with no write left are freed."""
        free = []
        for slot in slots:
            entry = self._evicting.get(slot)
            if entry is None:
                continue
            entry[1] -= 1
            if entry[1] <= 0:
                del self._evicting[slot]
                free.append(slot)
        if free:
            self.cpu.release_evicted(free)


__all__ = ["TierWrites"]
