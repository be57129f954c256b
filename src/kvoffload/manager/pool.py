"""The CPU tier's slots: which are free, which hold blocks (and in what state), which are held.

A slot is handed out fresh first (0, 1, 2, ...), then reused last-freed-first. Each slot keeps
one :class:`BlockStatus` object for its life in the pool: the policy shares it while a block
is stored there, and it comes back with the slot (a victim, a failed write).

A reset drops every block, but not the bytes of the jobs still in flight: a load may still be
copying a slot to the device and a store may still be writing one. Those slots are *held*:
neither stored nor free until the job's (stale) completion arrives or the caller says every
job of that generation is done (:meth:`SlotPool.release_held`). A victim evicted ahead for a
write-back tier is held the same way until the tier has copied its bytes out
(:meth:`SlotPool.hold_evicted` / :meth:`SlotPool.release_evicted`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kvoffload.keys import OffloadKey
from kvoffload.policies import BlockStatus


class HeldSlots:
    """The slots of the jobs that were in flight when one generation ended.

    With the blocks' keys (the policy kept a block table) each slot comes back when its own
    last job completes; without them, all come back when the generation's last job does.
    """

    __slots__ = ("_by_key", "_jobs", "_statuses")

    def __init__(
        self,
        statuses: list[BlockStatus],
        by_key: Mapping[OffloadKey, BlockStatus] | None = None,
    ) -> None:
        self._statuses = statuses
        self._by_key = dict(by_key) if by_key is not None else None
        # A pending block has one store in flight; a pinned one, ref_cnt loads.
        self._jobs = sum(s.ref_cnt if s.ref_cnt > 0 else 1 for s in statuses)

    def job_done(self, key: OffloadKey) -> list[BlockStatus]:
        """One job of this generation on ``key`` completed: return the slots now free."""
        if self._by_key is None:
            self._jobs -= 1
            if self._jobs > 0:
                return []
            return self.take_all()
        status = self._by_key.get(key)
        if status is None:
            return []
        status.ref_cnt = status.ref_cnt - 1 if status.ref_cnt > 0 else 0
        if status.ref_cnt:
            return []  # other loads of this generation still read it
        del self._by_key[key]
        return [status]

    def take_all(self) -> list[BlockStatus]:
        """Every slot still held (the generation's jobs are all done)."""
        if self._by_key is not None:
            statuses = list(self._by_key.values())
            self._by_key.clear()
        else:
            statuses = self._statuses
        self._statuses = []
        self._jobs = 0
        return statuses

    def __bool__(self) -> bool:
        return bool(self._by_key) if self._by_key is not None else self._jobs > 0


class SlotPool:
    """``capacity`` slots and the count of blocks in each state.

    Attributes the manager (and fast drivers such as the simulator's blocks mode) update in
    place: ``free`` (statuses of freed slots, reused from the end), ``next_fresh`` (slots from
    here on were never handed out), ``num_pending`` (blocks being written) and
    ``num_evictable`` (ready, unpinned blocks). Pinned blocks are the rest of the stored ones.
    """

    __slots__ = (
        "_evict_held",
        "_held",
        "_held_slots",
        "_statuses",
        "capacity",
        "free",
        "next_fresh",
        "num_evictable",
        "num_pending",
    )

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.next_fresh = 0
        self.free: list[BlockStatus] = []
        self.num_pending = 0
        self.num_evictable = 0
        self._statuses: list[BlockStatus] = []  # slot -> its status, for slots handed out
        self._held: dict[int, HeldSlots] = {}  # generation that ended -> its jobs' slots
        self._held_slots: set[int] = set()  # every held slot (both kinds)
        self._evict_held: dict[int, BlockStatus] = {}  # slot -> victim being written back

    # ------------------------------------------------------------------ gauges
    @property
    def num_held(self) -> int:
        """Slots of jobs in flight at a reset, or of victims being written back."""
        return len(self._held_slots)

    @property
    def num_stored(self) -> int:
        """Slots holding a block (being written, ready, or being read)."""
        return self.next_fresh - len(self.free) - len(self._held_slots)

    @property
    def num_pinned(self) -> int:
        """Blocks being read."""
        return self.num_stored - self.num_pending - self.num_evictable

    # ------------------------------------------------------------------ slots
    def allocate(self, count: int) -> list[BlockStatus]:
        """``count`` slots (at most the free ones), each status set to being written."""
        first = self.next_fresh
        fresh = min(self.capacity - first, count)
        allocated = [BlockStatus(slot, -1) for slot in range(first, first + fresh)]
        if fresh:
            self.next_fresh = first + fresh
            self._statuses += allocated
        if count > fresh:  # reuse freed slots (and their status objects), last freed first
            free = self.free
            reused = free[fresh - count :]
            del free[fresh - count :]
            reused.reverse()
            for status in reused:
                status.ref_cnt = -1
            allocated += reused
        return allocated

    def take(self) -> BlockStatus:
        """One slot (one must be free), set to being written."""
        if self.next_fresh < self.capacity:
            status = BlockStatus(self.next_fresh, -1)
            self.next_fresh += 1
            self._statuses.append(status)
            return status
        status = self.free.pop()
        status.ref_cnt = -1
        return status

    def release(self, statuses: Iterable[BlockStatus]) -> None:
        """Slots whose blocks are gone (victims, failed writes) become free."""
        for status in statuses:
            status.ref_cnt = 0
            self.free.append(status)

    def restore(self, statuses: list[BlockStatus], stored: Iterable[int]) -> None:
        """Start from a saved cache: ``statuses`` has one status per slot (``capacity`` of
        them), those of the ``stored`` slots hold ready, unpinned blocks; the rest are free."""
        if len(statuses) != self.capacity:
            raise ValueError(f"restore needs {self.capacity} slot statuses, got {len(statuses)}")
        taken = set(stored)
        self.next_fresh = self.capacity
        self._statuses = list(statuses)
        self.free = [s for s in reversed(statuses) if s.block_id not in taken]
        for status in self.free:
            status.ref_cnt = 0
        self.num_pending = 0
        self.num_evictable = len(taken)
        self._held.clear()
        self._held_slots.clear()
        self._evict_held.clear()

    def hold_evicted(self, statuses: Iterable[BlockStatus]) -> None:
        """Victims whose bytes are still being copied out: neither stored nor free (a reset
        keeps them held too) until :meth:`release_evicted`."""
        for status in statuses:
            self._held_slots.add(status.block_id)
            self._evict_held[status.block_id] = status

    def release_evicted(self, slot: int) -> bool:
        """The copy out of evicted-ahead ``slot`` is done: it becomes free. False if the slot
        was not held for that."""
        status = self._evict_held.pop(slot, None)
        if status is None:
            return False
        self._unhold([status])
        return True

    # ------------------------------------------------------------------ resets
    def in_flight(self) -> list[BlockStatus]:
        """Statuses of the stored blocks being written or read (a scan; for resets)."""
        expected = self.num_pending + self.num_pinned
        found: list[BlockStatus] = []
        if expected:
            held = self._held_slots
            for status in self._statuses:  # free slots' statuses are 0 (see release)
                if status.ref_cnt and status.block_id not in held:
                    found.append(status)
                    if len(found) == expected:
                        break
        return found

    def reset(
        self,
        generation: int,
        in_flight: list[BlockStatus],
        by_key: Mapping[OffloadKey, BlockStatus] | None = None,
    ) -> None:
        """Every block is gone; the slots of ``in_flight`` jobs stay held for ``generation``.

        ``by_key`` (the in-flight blocks by key) lets each slot come back with its own job.
        """
        self.num_pending = 0
        self.num_evictable = 0
        if in_flight:
            self._held[generation] = HeldSlots(in_flight, by_key)
            self._held_slots.update(s.block_id for s in in_flight)
        if not self._held_slots:  # nothing in flight: as good as new
            self.next_fresh = 0
            self.free = []
            self._statuses = []
            return
        held = self._held_slots
        free = [s for s in reversed(self._statuses) if s.block_id not in held]
        for status in free:  # lowest slot handed out first
            status.ref_cnt = 0
        self.free = free

    def job_done(self, generation: int, key: OffloadKey) -> None:
        """A job prepared in ``generation`` (ended by a reset) on ``key`` completed."""
        held = self._held.get(generation)
        if held is None:
            return  # released already (release_held)
        self._unhold(held.job_done(key))
        if not held:
            del self._held[generation]

    def release_held(self) -> int:
        """Every job prepared before the last reset is done: free their slots; return how many."""
        statuses = [s for held in self._held.values() for s in held.take_all()]
        self._held.clear()
        self._unhold(statuses)
        return len(statuses)

    def _unhold(self, statuses: list[BlockStatus]) -> None:
        for status in statuses:
            self._held_slots.discard(status.block_id)
        self.release(statuses)


__all__ = ["HeldSlots", "SlotPool"]
