"""LeCaR (Vietri et al., HotStorage'18): regret-minimising mix of an LRU and an LFU expert.

Each eviction asks two experts for a victim: LRU (least recently used block) and LFU (fewest
uses since it was stored, oldest first among equals). When they disagree, one is drawn at
random with probability proportional to its weight, and the victim's key goes into *that*
expert's history (a FIFO of ``int(history_ratio * capacity)`` keys with the eviction time).
A miss on a key in an expert's history is that expert's regret: its weight is multiplied by
``exp(-learning_rate * discount ** t)`` (``t`` = accesses since the eviction, ``discount =
0.005 ** (1 / capacity)``, so recent mistakes weigh most) and the weights are renormalised.
When both experts pick the same block nobody is to blame: no random draw, no history entry
(as in libCacheSim 0.3.5). A weight never drops below ``1e-6``, so a silenced expert can win
its trust back.

Randomness comes from a private ``random.Random(seed)``: two instances with the same seed and
the same calls make the same choices, and ``clear`` reseeds. A failed ``evict`` checks the
number of eligible blocks first and draws nothing. (libCacheSim's LeCaR draws from a
thread-local generator that cannot be seeded, so it is tested against a reference model.)

Pinning: both experts see only evictable blocks (the LRU order and the per-count buckets are
kept by the mark hooks); use counts of pinned blocks keep growing. A block that becomes
evictable again counts as recently used.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import chain

from kvoffload._checks import check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import ref_count

_MIN_WEIGHT = 1e-6
_LRU, _LFU = 0, 1


class LeCaRCachePolicy(CachePolicy):
    """LeCaR (HotStorage'18): learns online how to mix LRU and LFU evictions from its regrets."""

    name = "lecar"

    def __init__(
        self,
        cache_capacity: int,
        *,
        learning_rate: float = 0.45,
        initial_lru_weight: float = 0.5,
        history_ratio: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(cache_capacity)
        self.learning_rate = check_number("learning_rate", learning_rate, 0.0, 100.0)
        self.initial_lru_weight = check_number(
            "initial_lru_weight", initial_lru_weight, _MIN_WEIGHT, 1.0 - _MIN_WEIGHT
        )
        self.history_ratio = check_number("history_ratio", history_ratio, 0.0, 16.0)
        self.seed = check_int("seed", seed)
        self._history_limit = int(cache_capacity * self.history_ratio)
        self._discount = 0.005 ** (1.0 / cache_capacity) if cache_capacity else 0.0
        self._freq: dict[OffloadKey, int] = {}
        self._lru: OrderedDict[OffloadKey, None] = OrderedDict()  # evictable, LRU first
        self._buckets: dict[int, OrderedDict[OffloadKey, None]] = {}  # evictable by use count
        self._counts: list[int] = []  # sorted keys of _buckets
        # Per-expert histories: evicted key -> eviction time, oldest first.
        self._histories = (OrderedDict[OffloadKey, int](), OrderedDict[OffloadKey, int]())
        self._w_lru = self.initial_lru_weight
        self._now = 0
        self._rng = random.Random(seed)

    @property
    def lru_weight(self) -> float:
        """The LRU expert's current weight (the LFU expert has ``1 - lru_weight``)."""
        return self._w_lru

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        for history in self._histories:  # a stored key is never also a ghost
            history.pop(key, None)
        self._freq[key] = 1
        if block.ref_cnt == 0:
            self._enter(key)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        for history in self._histories:  # a stored key is never also a ghost
            if not history.keys().isdisjoint(keys):
                for key in keys:
                    history.pop(key, None)
        self._freq.update(dict.fromkeys(keys, 1))
        if 0 in map(ref_count, blocks):  # inserted evictable: they enter the orders, in order
            for key, block in zip(keys, blocks, strict=True):
                if block.ref_cnt == 0:
                    self._enter(key)

    def _enter(self, key: OffloadKey) -> None:
        self._lru[key] = None
        self._lru.move_to_end(key)
        count = self._freq[key]
        bucket = self._buckets.get(count)
        if bucket is None:
            bucket = self._buckets[count] = OrderedDict()
            insort(self._counts, count)
        bucket[key] = None

    def _leave(self, key: OffloadKey) -> bool:
        """Take ``key`` out of the eviction orders; False if it was not in them."""
        if self._lru.pop(key, 0) is not None:
            return False
        count = self._freq[key]
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]
            del self._counts[bisect_left(self._counts, count)]
        return True

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._leave(key)
        del self._freq[key]

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        blocks = self._blocks
        lru_history, lfu_history = self._histories
        if (
            blocks.keys().isdisjoint(keys)
            and lru_history.keys().isdisjoint(keys)
            and lfu_history.keys().isdisjoint(keys)
        ):
            self._now += len(keys)  # neither stored nor remembered: only the clock moves
            return
        lru, freqs = self._lru, self._freq
        for key in reversed(keys):
            self._now += 1
            if key in blocks:
                if key in lru:  # evictable: it leaves and re-enters the orders
                    self._leave(key)
                    freqs[key] += 1
                    self._enter(key)
                else:
                    freqs[key] += 1
                continue
            if key in lru_history:
                self._regret(_LRU, self._now - lru_history.pop(key))
            elif key in lfu_history:
                self._regret(_LFU, self._now - lfu_history.pop(key))

    def _regret(self, expert: int, age: int) -> None:
        """The expert that evicted a block missed ``age`` accesses later loses weight."""
        penalty = math.exp(-self.learning_rate * self._discount**age)
        w_lru, w_lfu = self._w_lru, 1.0 - self._w_lru
        if expert == _LRU:
            w_lru *= penalty
        else:
            w_lfu *= penalty
        self._w_lru = min(max(w_lru / (w_lru + w_lfu), _MIN_WEIGHT), 1.0 - _MIN_WEIGHT)

    def _lfu_order(self, protected: Collection[OffloadKey]) -> Iterator[OffloadKey]:
        for count in self._counts:
            for key in self._buckets[count]:
                if key not in protected:
                    yield key

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        lru = self._lru
        if not isinstance(protected, (set, frozenset)):
            protected = set(protected)
        blocked = len(lru.keys() & protected)
        if n > len(lru) - blocked:  # checked first: a refusal must not draw random numbers
            return None
        chosen: dict[OffloadKey, int | None] = {}
        lru_iter: Iterator[OffloadKey]
        lfu_iter: Iterator[OffloadKey]
        if blocked:
            lru_iter = (key for key in lru if key not in protected)
            lfu_iter = self._lfu_order(protected)
        else:  # nothing to skip: the orders themselves (buckets by increasing count)
            lru_iter = iter(lru)
            lfu_iter = chain.from_iterable(map(self._buckets.__getitem__, self._counts))
        lru_pick, lfu_pick = next(lru_iter), next(lfu_iter)
        draw, w_lru = self._rng.random, self._w_lru
        for _ in range(n):
            if lru_pick == lfu_pick:
                chosen[lru_pick] = None
            elif draw() < w_lru:
                chosen[lru_pick] = _LRU
            else:
                chosen[lfu_pick] = _LFU
            if len(chosen) == n:
                break
            while lru_pick in chosen:
                lru_pick = next(lru_iter)
            while lfu_pick in chosen:
                lfu_pick = next(lfu_iter)
        lru, freqs, buckets = self._lru, self._freq, self._buckets
        remember = self._history_limit > 0
        for key, expert in chosen.items():
            # _leave(key), inlined: every victim is evictable.
            del lru[key]
            count = freqs.pop(key)
            bucket = buckets[count]
            del bucket[key]
            if not bucket:
                del buckets[count]
                del self._counts[bisect_left(self._counts, count)]
            if expert is not None and remember:
                history = self._histories[expert]
                history[key] = self._now
                if len(history) > self._history_limit:
                    history.popitem(last=False)
        return list(chosen)

    def on_clear(self) -> None:
        for container in (self._freq, self._lru, self._buckets, *self._histories):
            container.clear()
        self._counts.clear()
        self._w_lru = self.initial_lru_weight
        self._now = 0
        self._rng.seed(self.seed)

    def mark_evictable(self, key: OffloadKey) -> None:
        if key in self._blocks and key not in self._lru:
            self._enter(key)
        elif key in self._lru:
            self._lru.move_to_end(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        blocks, lru, freqs, buckets = self._blocks, self._lru, self._freq, self._buckets
        last_count, last_bucket = -1, None  # the bucket entered last (usually all share one)
        for key in keys:
            if key in lru:
                lru.move_to_end(key)
            elif key in blocks:
                # _enter(key), inlined.
                lru[key] = None
                count = freqs[key]
                if count != last_count or last_bucket is None:
                    bucket = buckets.get(count)
                    if bucket is None:
                        bucket = buckets[count] = OrderedDict()
                        insort(self._counts, count)
                    last_count, last_bucket = count, bucket
                last_bucket[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if key in self._lru:
            self._leave(key)

    def stats(self) -> Mapping[str, float]:
        return {
            "lru_weight": self._w_lru,
            "lru_history": len(self._histories[_LRU]),
            "lfu_history": len(self._histories[_LFU]),
            "blocks": len(self._blocks),
            "evictable": len(self._lru),
        }
