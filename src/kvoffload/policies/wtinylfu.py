"""W-TinyLFU (Einziger, Friedman & Manes, ACM TOS 2017; Caffeine's policy).

New blocks enter a small LRU *window*. When the window is full, its LRU block (the candidate)
must beat the main cache's probation LRU block (the victim) on TinyLFU's frequency estimate to
get into the main cache; the loser is evicted. The main cache is an SLRU: probation, and a
protected segment (``protected_ratio`` of main, 80% by default) that probation blocks reach
on their next use. The estimates come from :class:`~kvoffload.policies.frequency_sketch.
FrequencySketch` (4-bit count-min counters plus a doorkeeper, halved every
``sample_factor * capacity`` uses); every ``touch`` records one use, hit or miss.

With ``adaptive=True`` (the default) the window size is tuned by Caffeine-style hill climbing:
after each sample of ``sample_factor * capacity`` accesses the window moves by a step (6.25% of
the capacity at first, decaying by 0.98 per sample, reset when the hit rate jumps by 5 points)
in the direction that last improved the hit rate, starting by growing it. Unlike Caffeine, a
step that runs into a bound (1 block, or the whole capacity) turns the next step back inward,
so a flat hit rate cannot pin the window to a wall for good. ``adaptive=False`` keeps the
window at ``window_ratio`` of the capacity. There is no random jitter.

Documented difference from libCacheSim 0.3.5 ``WTinyLFU(window_size=0.01)`` (non-adaptive
there): its window holds ``int(0.01 * capacity)`` objects and it stores nothing at all below 100
blocks; its sketch is a 10-hash counting Bloom filter with unbounded counters, fed on insertion,
on hits in the main cache only (not the window) and again for every window block it moves to
the main cache or duels, and halved after ``32 * main size`` main-cache hits; its main SLRU
has libCacheSim's warm-up and rounding quirks (see :mod:`kvoffload.policies.slru`). Hit counts
therefore differ (measured in the tests); this policy follows the paper and Caffeine.

Pinning: the window, probation and protected orders hold only evictable blocks (sizes count
all). Eviction falls back from the duel to probation, protected, then window LRU blocks when
pins or ``protected`` keys leave no candidate; it checks first that ``n`` eligible blocks exist,
so a failed ``evict`` changes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload._checks import check_bool, check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.frequency_sketch import FrequencySketch
from kvoffload.policies.victims import append_absent, protected_disjoint, ready_keys

WINDOW, PROBATION, PROTECTED = 0, 1, 2
STEP_FRACTION = 0.0625
STEP_DECAY = 0.98
RESTART_THRESHOLD = 0.05


class WTinyLFUCachePolicy(CachePolicy):
    """W-TinyLFU (ACM TOS'17): an LRU window, then a frequency-filtered SLRU main cache."""

    name = "wtinylfu"

    def __init__(
        self,
        cache_capacity: int,
        *,
        window_ratio: float = 0.01,
        protected_ratio: float = 0.8,
        adaptive: bool = True,
        sample_factor: int = 10,
        doorkeeper: bool = True,
    ) -> None:
        super().__init__(cache_capacity)
        self.window_ratio = check_number("window_ratio", window_ratio, 0.0, 1.0)
        self.protected_ratio = check_number("protected_ratio", protected_ratio, 0.0, 1.0)
        check_bool("adaptive", adaptive)
        check_bool("doorkeeper", doorkeeper)
        self.sample_factor = check_int(
            "sample_factor", sample_factor, 1, 1000, why=" (uses per capacity between agings)"
        )
        self.adaptive = adaptive
        self._sample_size = sample_factor * max(1, cache_capacity)
        self._sketch = FrequencySketch(
            cache_capacity, sample_size=self._sample_size, doorkeeper=doorkeeper
        )
        # Per region, the blocks that are not evictable (pending or pinned); an evictable
        # block's region is the order that holds it.
        self._parked: tuple[set[OffloadKey], ...] = (set(), set(), set())
        self._sizes = [0, 0, 0]  # resident blocks per region, pinned included
        # Evictable blocks per region, LRU first.
        self._orders: tuple[OrderedDict[OffloadKey, None], ...] = (
            OrderedDict(),
            OrderedDict(),
            OrderedDict(),
        )
        self._reset_window()

    def _reset_window(self) -> None:
        capacity = self.cache_capacity
        self._window_target = float(max(1, int(capacity * self.window_ratio)) if capacity else 0)
        self._step = STEP_FRACTION * capacity
        self._hits = 0
        self._misses = 0
        self._previous_hit_rate = 0.0
        self._set_limits()

    def _set_limits(self) -> None:
        self._window_limit = int(self._window_target)
        main = self.cache_capacity - self._window_limit
        self._protected_limit = int(main * self.protected_ratio)

    @property
    def window_limit(self) -> int:
        """Current window size target in blocks (moves when ``adaptive``)."""
        return self._window_limit

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        self._sizes[WINDOW] += 1
        if block.ref_cnt == 0:
            self._orders[WINDOW][key] = None
        else:
            self._parked[WINDOW].add(key)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        """The batch into the window at once (every insert goes there, nothing else moves).

        Kept because it beats the base loop (``policy_cost.py --base-loops``; figures in
        ``docs/benchmarks.md``).
        """
        self._sizes[WINDOW] += len(keys)
        parked = self._parked[WINDOW]
        parked.update(keys)
        ready = ready_keys(keys, blocks)
        if ready:  # inserted ready: evictable at once, in order
            parked.difference_update(ready)
            window = self._orders[WINDOW]
            for key in ready:
                window[key] = None

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """Completed stores (all parked in the window, the usual case) in one pass; anything
        else one key at a time. Kept with :meth:`on_insert_many` (see there)."""
        parked = self._parked[WINDOW]
        if parked.issuperset(keys):
            parked.difference_update(keys)
            append_absent(self._orders[WINDOW], keys)
            return
        mark_evictable = self.mark_evictable
        for key in keys:
            mark_evictable(key)

    def _region_of(self, key: OffloadKey) -> int | None:
        """The region of a stored block, ``None`` if not stored."""
        window, probation, protected = self._orders
        if key in probation:
            return PROBATION
        if key in protected:
            return PROTECTED
        if key in window:
            return WINDOW
        for region, parked in enumerate(self._parked):
            if key in parked:
                return region
        return None

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        region = self._region_of(key)
        if region is not None:  # (always: the block was stored)
            self._orders[region].pop(key, None)
            self._parked[region].discard(key)
            self._sizes[region] -= 1

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        walk = list(reversed(keys if isinstance(keys, (list, tuple)) else list(keys)))
        # The sketch first (it reads nothing else): one use per key, tail to head.
        self._sketch.increment_keys(walk)
        blocks = self._blocks
        if not self.adaptive or self._hits + self._misses + len(walk) < self._sample_size:
            # No hill-climbing step falls in this call: count the hits, move them.
            if blocks.keys().isdisjoint(walk):  # all misses: the usual store
                self._misses += len(walk)
                return
            stored = [key for key in walk if key in blocks]
            self._hits += len(stored)
            self._misses += len(walk) - len(stored)
            window, probation, protected = self._orders
            for key in stored:
                if key in protected:
                    protected.move_to_end(key)
                elif key in window:
                    window.move_to_end(key)
                elif key in probation or key in self._parked[PROBATION]:
                    self._move(key, PROBATION, PROTECTED)
                    self._demote_protected_surplus()
            return
        window, probation, protected = self._orders
        for key in walk:
            if key in protected:
                protected.move_to_end(key)
                self._hits += 1
            elif key in window:
                window.move_to_end(key)
                self._hits += 1
            else:
                region = PROBATION if key in probation else self._region_of(key)
                if region is None:
                    self._misses += 1
                else:
                    self._hits += 1
                    if region == PROBATION:
                        self._move(key, PROBATION, PROTECTED)
                        self._demote_protected_surplus()
            if self.adaptive and self._hits + self._misses >= self._sample_size:
                self._climb()

    def _move(self, key: OffloadKey, src: int, dst: int) -> None:
        self._sizes[src] -= 1
        self._sizes[dst] += 1
        if self._orders[src].pop(key, 0) is None:
            self._orders[dst][key] = None
        else:
            self._parked[src].discard(key)
            self._parked[dst].add(key)

    def _demote_protected_surplus(self) -> None:
        order = self._orders[PROTECTED]
        while self._sizes[PROTECTED] > self._protected_limit and order:
            self._move(next(iter(order)), PROTECTED, PROBATION)

    def _climb(self) -> None:
        """One hill-climbing step on the window size, from the last sample's hit rate."""
        hit_rate = self._hits / (self._hits + self._misses)
        change = hit_rate - self._previous_hit_rate
        amount = self._step if change >= 0 else -self._step
        if abs(change) >= RESTART_THRESHOLD:
            self._step = STEP_FRACTION * self.cache_capacity * (1.0 if amount >= 0 else -1.0)
        else:
            self._step = STEP_DECAY * amount
        self._previous_hit_rate = hit_rate
        self._hits = self._misses = 0
        wanted = self._window_target + amount
        self._window_target = min(float(self.cache_capacity), max(1.0, wanted))
        if self._window_target != wanted:  # hit a bound: explore back inward next time
            self._step = abs(self._step) * (1.0 if wanted < self._window_target else -1.0)
        self._set_limits()
        self._demote_protected_surplus()

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if not isinstance(protected, (set, frozenset)):
            protected = set(protected)
        orders = self._orders
        window, probation, main_protected = orders
        evictable = len(window) + len(probation) + len(main_protected)
        if n + len(protected) > evictable:  # protected keys might leave too few: count them
            blocked = sum(len(order.keys() & protected) for order in orders)
            if n > evictable - blocked:
                return None
        # One eviction at a time: while the window holds at least its limit, its least recent
        # eligible block (the candidate) moves to probation if main has room, else duels the
        # main cache's first eligible block; otherwise the first eligible block of probation,
        # protected, then the window goes. Moves free nothing, and a duel keeps main's size,
        # so the steps come in phases: moves, then duels, then plain takes; each phase is
        # done in one pass.
        sizes = self._sizes
        window_limit = self._window_limit
        main_limit = self.cache_capacity - window_limit
        victims: list[OffloadKey] = []
        moves = min(
            sizes[WINDOW] - window_limit + 1, main_limit - sizes[PROBATION] - sizes[PROTECTED]
        )
        if moves > 0 and window:
            moved = list(islice(window, moves))
            if protected and not protected_disjoint(protected, moved):
                moved = []
                for key in window:
                    if key not in protected:
                        moved.append(key)
                        if len(moved) == moves:
                            break
            for key in moved:
                del window[key]
                probation[key] = None
            sizes[WINDOW] -= len(moved)
            sizes[PROBATION] += len(moved)
        estimate = self._sketch.estimate
        while len(victims) < n and sizes[WINDOW] >= window_limit:  # duels
            candidate = victim = None
            for key in window:
                if key not in protected:
                    candidate = key
                    break
            if candidate is None:
                break
            region = PROBATION
            for key in probation:
                if key not in protected:
                    victim = key
                    break
            else:
                region = PROTECTED
                for key in main_protected:
                    if key not in protected:
                        victim = key
                        break
            if victim is not None and estimate(candidate) > estimate(victim):
                del window[candidate]
                probation[candidate] = None
                sizes[WINDOW] -= 1
                sizes[PROBATION] += 1
            else:
                victim, region = candidate, WINDOW
            del orders[region][victim]
            sizes[region] -= 1
            victims.append(victim)
        left = n - len(victims)
        if left:  # plain takes: the first eligible blocks of probation, protected, window
            taken = list(islice(probation, left))
            if len(taken) == left and (not protected or protected_disjoint(protected, taken)):
                for key in taken:  # the usual case: all from probation
                    del probation[key]
                sizes[PROBATION] -= left
                victims += taken
                return victims
            for region in (PROBATION, PROTECTED, WINDOW):
                order = orders[region]
                taken = []
                for key in order:
                    if key not in protected:
                        taken.append(key)
                        if len(taken) == left:
                            break
                for key in taken:
                    del order[key]
                victims += taken
                sizes[region] -= len(taken)
                left -= len(taken)
                if not left:
                    break
            else:
                raise RuntimeError("no eligible block although evict checked there was one")
        return victims

    def on_clear(self) -> None:
        for parked in self._parked:
            parked.clear()
        self._sizes = [0, 0, 0]
        for order in self._orders:
            order.clear()
        self._sketch.clear()
        self._reset_window()

    def mark_evictable(self, key: OffloadKey) -> None:
        for region, parked in enumerate(self._parked):
            if key in parked:
                parked.remove(key)
                self._orders[region][key] = None
                return
        where = self._region_of(key)  # already evictable (or not stored)
        if where is not None:
            self._orders[where].move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        window, probation, protected = self._orders
        if key in probation:
            del probation[key]
            self._parked[PROBATION].add(key)
        elif key in protected:
            del protected[key]
            self._parked[PROTECTED].add(key)
        elif key in window:
            del window[key]
            self._parked[WINDOW].add(key)

    def stats(self) -> Mapping[str, float]:
        return {
            "window_limit": self._window_limit,
            "window_size": self._sizes[WINDOW],
            "probation_size": self._sizes[PROBATION],
            "protected_size": self._sizes[PROTECTED],
            "evictable": sum(len(order) for order in self._orders),
        }
