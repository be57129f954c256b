"""CLOCK: a ring of blocks with small use counters swept by a hand (second chance).

The ring is kept as a queue whose front is the block under the hand: a new block goes just
behind the hand (the back), a use raises the block's counter (up to ``2**n_bit_counter - 1``),
and eviction looks at the block under the hand: counter 0 -> victim; otherwise the counter
drops by one and the hand moves on (the block goes to the back). With ``n_bit_counter=1`` this
is the classic reference-bit CLOCK. Driven one block at a time without pins it makes exactly
libCacheSim's ``Clock(init_freq, n_bit_counter)`` decisions.

Pinned, pending and protected blocks under the hand are passed over with their counter
unchanged (they stay where they are in the ring; the hand simply moves past them). The cost:
each sweep steps over those blocks, so eviction is O(victims + counters cleared + blocks in
flight) rather than O(victims).

``evict`` is atomic without undo: it first checks that enough blocks are eligible, then finds
the victims by reading the ring (in sweep ``r`` the hand takes the eligible blocks whose
counter was ``r``), and only then commits the counter decrements and the hand's move.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from kvoffload._checks import check_int
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus
from kvoffload.policies.evictable_set import EvictableSetPolicy

_MAX_COUNTER_BITS = 16


class ClockCachePolicy(EvictableSetPolicy):
    """CLOCK (second chance): a hand sweeps the blocks and evicts the first one not used lately."""

    name = "clock"

    def __init__(self, cache_capacity: int, *, init_freq: int = 0, n_bit_counter: int = 1) -> None:
        super().__init__(cache_capacity)
        self.n_bit_counter = check_int("n_bit_counter", n_bit_counter, 1, _MAX_COUNTER_BITS)
        self.max_freq = (1 << self.n_bit_counter) - 1
        self.init_freq = check_int("init_freq", init_freq, 0, self.max_freq)
        # The ring as a queue: the front is under the hand. Holds pinned/pending blocks too.
        self._ring: OrderedDict[OffloadKey, int] = OrderedDict()  # key -> use counter

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        super().on_insert(key, block, req_context)
        self._ring[key] = self.init_freq

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        super().on_remove(key, block)
        del self._ring[key]

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Raise the counter of each ready block (a block still being written is not used)."""
        blocks, ring, top = self._blocks, self._ring, self.max_freq
        for key in keys:
            status = blocks.get(key)
            if status is not None and status.ref_cnt >= 0 and ring[key] < top:
                ring[key] += 1

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if not self._can_evict(n, protected):
            return None
        evictable, ring = self._evictable, self._ring
        chosen: list[OffloadKey] = []
        passed: list[OffloadKey] = []  # keys the hand passed in its last (partial) sweep
        sweep = 0
        # Every eligible counter is <= max_freq, so sweep max_freq at the latest finds n.
        while len(chosen) < n:
            passed.clear()
            for key, counter in ring.items():
                passed.append(key)
                if counter == sweep and key in evictable and key not in protected:
                    chosen.append(key)
                    if len(chosen) == n:
                        break
            else:
                sweep += 1
        self._commit(chosen, passed, sweep, protected)
        return chosen

    def _commit(
        self,
        chosen: list[OffloadKey],
        passed: list[OffloadKey],
        sweep: int,
        protected: Collection[OffloadKey],
    ) -> None:
        """Apply the sweeps found by ``evict``: decrements, victims out, hand moved on."""
        ring, evictable = self._ring, self._evictable
        for key in chosen:
            del ring[key]
            evictable.remove(key)
        if sweep:  # full sweeps: every eligible survivor lost ``sweep`` from its counter
            for key in ring:
                if key in evictable and key not in protected:
                    ring[key] -= sweep
        for key in passed:  # the last sweep's part: one more decrement, moved behind the hand
            if key in ring:
                if key in evictable and key not in protected:
                    ring[key] -= 1
                ring.move_to_end(key)

    def on_clear(self) -> None:
        super().on_clear()
        self._ring.clear()
