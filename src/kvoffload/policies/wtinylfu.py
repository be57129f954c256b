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
from collections.abc import Collection, Iterable, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims
from kvoffload.policies.frequency_sketch import FrequencySketch

WINDOW, PROBATION, PROTECTED = 0, 1, 2
STEP_FRACTION = 0.0625
STEP_DECAY = 0.98
RESTART_THRESHOLD = 0.05


def _check_fraction(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return float(value)


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
        self.window_ratio = _check_fraction("window_ratio", window_ratio, 0.0, 1.0)
        self.protected_ratio = _check_fraction("protected_ratio", protected_ratio, 0.0, 1.0)
        if not isinstance(adaptive, bool) or not isinstance(doorkeeper, bool):
            raise TypeError("adaptive and doorkeeper must be True or False")
        if isinstance(sample_factor, bool) or not isinstance(sample_factor, int):
            raise TypeError(f"sample_factor must be an int, got {type(sample_factor).__name__}")
        if not 1 <= sample_factor <= 1000:
            raise ValueError(
                f"sample_factor must be in [1, 1000] (uses per capacity between agings), "
                f"got {sample_factor}"
            )
        self.adaptive = adaptive
        self.sample_factor = sample_factor
        self._sample_size = sample_factor * max(1, cache_capacity)
        self._sketch = FrequencySketch(
            cache_capacity, sample_size=self._sample_size, doorkeeper=doorkeeper
        )
        self._blocks: dict[OffloadKey, BlockStatus] = {}
        self._region: dict[OffloadKey, int] = {}
        self._hash: dict[OffloadKey, int] = {}  # sketch hash of every resident block
        self._sizes = [0, 0, 0]  # resident blocks per region, pinned included
        # Evictable blocks per region, LRU first.
        self._orders: tuple[OrderedDict[OffloadKey, None], ...] = (
            OrderedDict(), OrderedDict(), OrderedDict()
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

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._blocks.get(key)

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        self._blocks[key] = block
        self._hash[key] = self._sketch.key_hash(key)
        self._region[key] = WINDOW
        self._sizes[WINDOW] += 1
        if block.ref_cnt == 0:
            self._orders[WINDOW][key] = None

    def remove(self, key: OffloadKey) -> None:
        if self._blocks.pop(key, None) is None:
            return
        del self._hash[key]
        region = self._region.pop(key)
        self._sizes[region] -= 1
        self._orders[region].pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        sketch, hashes = self._sketch, self._hash
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            key_hash = hashes.get(key)
            sketch.increment_hash(sketch.key_hash(key) if key_hash is None else key_hash)
            region = self._region.get(key)
            if region is None:
                self._misses += 1
            else:
                self._hits += 1
                if region == PROBATION:
                    self._move(key, PROBATION, PROTECTED)
                    self._demote_protected_surplus()
                elif key in self._orders[region]:
                    self._orders[region].move_to_end(key)
            if self.adaptive and self._hits + self._misses >= self._sample_size:
                self._climb()

    def _move(self, key: OffloadKey, src: int, dst: int) -> None:
        self._sizes[src] -= 1
        self._sizes[dst] += 1
        self._region[key] = dst
        if self._orders[src].pop(key, 0) is None:
            self._orders[dst][key] = None

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

    def _first_eligible(self, region: int, protected: Collection[OffloadKey]) -> OffloadKey | None:
        for key in self._orders[region]:
            if key not in protected:
                return key
        return None

    def _take(self, key: OffloadKey) -> tuple[OffloadKey, BlockStatus]:
        region = self._region.pop(key)
        self._sizes[region] -= 1
        del self._orders[region][key]
        del self._hash[key]
        return key, self._blocks.pop(key)

    def _evict_one(self, protected: Collection[OffloadKey]) -> tuple[OffloadKey, BlockStatus]:
        sizes = self._sizes
        while True:
            candidate = self._first_eligible(WINDOW, protected)
            if candidate is not None and sizes[WINDOW] >= self._window_limit:
                if sizes[PROBATION] + sizes[PROTECTED] < self.cache_capacity - self._window_limit:
                    self._move(candidate, WINDOW, PROBATION)  # main has room: no duel yet
                    continue
                victim = self._first_eligible(PROBATION, protected)
                if victim is None:
                    victim = self._first_eligible(PROTECTED, protected)
                estimate, hashes = self._sketch.estimate_hash, self._hash
                if victim is not None and estimate(hashes[candidate]) > estimate(hashes[victim]):
                    self._move(candidate, WINDOW, PROBATION)
                    return self._take(victim)
                return self._take(candidate)
            for region in (PROBATION, PROTECTED, WINDOW):
                victim = self._first_eligible(region, protected)
                if victim is not None:
                    return self._take(victim)
            raise RuntimeError("no eligible block although evict checked there was one")

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        if not isinstance(protected, (set, frozenset)):
            protected = set(protected)
        evictable = sum(len(order) for order in self._orders)
        region_of, orders = self._region.get, self._orders
        blocked = 0
        for key in protected:
            region = region_of(key)
            if region is not None and key in orders[region]:
                blocked += 1
        if n > evictable - blocked:
            return None
        return [self._evict_one(protected) for _ in range(n)]

    def clear(self) -> None:
        self._blocks.clear()
        self._region.clear()
        self._hash.clear()
        self._sizes = [0, 0, 0]
        for order in self._orders:
            order.clear()
        self._sketch.clear()
        self._reset_window()

    def mark_evictable(self, key: OffloadKey) -> None:
        region = self._region.get(key)
        if region is not None:
            order = self._orders[region]
            order[key] = None
            order.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        region = self._region.get(key)
        if region is not None:
            self._orders[region].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        return {
            "window_limit": self._window_limit,
            "window_size": self._sizes[WINDOW],
            "probation_size": self._sizes[PROBATION],
            "protected_size": self._sizes[PROTECTED],
            "evictable": sum(len(order) for order in self._orders),
        }
