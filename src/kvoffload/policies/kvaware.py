"""KV-aware adaptive eviction: learn which kinds of blocks get reused, evict the unlikely ones.

Prefix-cache blocks are not alike. On the Mooncake traces most blocks are never reused, a
request's last (partial) block almost never is, a block that was reused is likely to be reused
again and sooner, and whether a conversation comes back depends strongly on what its last
request looked like (a short answer is usually followed by another turn; a long generation
usually ends the session). How strongly each of these holds depends on the workload, so the
policy learns it online from the traffic it sees: no future knowledge, no per-trace tables.

Every stored block belongs to a *class* built from signals an engine has when it calls:

* how many times the block was used since it was first stored (0, 1, 2+; evicted blocks keep
  their count in a bounded ghost table, so a block that comes back is recognised);
* the generated length of the last request that used it (``ReqContext.output_tokens``, known
  when the request finishes: short, medium, long or unknown);
* whether it is a request's last, partially filled block (``ReqContext.partial_tail_key``).

A request's blocks are (re)classified when it finishes (``on_request_finished``). Per class the
policy keeps exponentially decayed counts of entries and reuses (reuses of evicted blocks are
seen through the ghost table) and the mean time from a use to the next, and scores a block idle
for ``d`` seconds by its chance of being used within the cache's horizon ``H`` under an
exponential reuse-time model (as in Alibaba's WA policy, ATC'25)::

    score = p e^{-d/g} (1 - e^{-H/g}) / (1 - p + p e^{-d/g})

where ``H`` is ``horizon_factor`` times the time the cache takes to turn over (capacity /
insertion rate). The victim is the block with the lowest score. Each class keeps its evictable
blocks in recency order (tails before heads within a request), and the score falls with idle
time, so only each class's oldest block is a candidate: an eviction costs O(classes), never a
scan. Time is the requests' ``timestamp`` when given, else a logical clock (one tick per
touched or inserted block).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from itertools import chain, compress, islice, repeat
from itertools import count as count_from
from typing import Final

from kvoffload._checks import check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import protected_disjoint, ref_count

_COUNT_BUCKETS = 4  # used 0, 1, 2-3, 4+ times since first stored (log2 buckets)
_OUTPUT_NAMES = ("short", "medium", "long", "unknown")
_UNKNOWN_OUTPUT = len(_OUTPUT_NAMES) - 1
TAIL_CLASS = _COUNT_BUCKETS * len(_OUTPUT_NAMES)
_NUM_CLASSES = TAIL_CLASS + 1
CLASS_NAMES = (
    *(f"used{c}_{o}" for c in ("0", "1", "2-3", "4+") for o in _OUTPUT_NAMES),
    "partial_tail",
)


def _class_of(uses: int, output_bucket: int) -> int:
    return min(uses.bit_length(), _COUNT_BUCKETS - 1) * len(_OUTPUT_NAMES) + output_bucket


# Per-block metadata, a plain tuple (class, uses since first stored, output bucket, last use):
# built at C speed, so a store of many new blocks costs no Python object construction; the
# rare changes (a use, a reclassification) build a new one. An evicted block's tuple is its
# ghost entry as it is.
_Meta = tuple[int, int, int, float]
_CLS: Final = 0
_LAST_USE: Final = 3
_NEW_CLASS = _class_of(0, _UNKNOWN_OUTPUT)
# A block's class by its uses, less its output bucket (_class_of; the last holds from there),
# and the class of a block that came back (its output is not known yet).
_SATURATED = 1 << (_COUNT_BUCKETS - 1)
_USES_CLASS = tuple(_class_of(uses, 0) for uses in range(_SATURATED + 1))
_RETURNED_CLASS = tuple(cls + _UNKNOWN_OUTPUT for cls in _USES_CLASS)
# _class_of(uses, bucket) by table: _BUCKET_CLASSES[bucket][min(uses, _SATURATED)].
_BUCKET_CLASSES = tuple(
    tuple(cls + bucket for cls in _USES_CLASS) for bucket in range(len(_OUTPUT_NAMES))
)
_EXACT = 1 << 53  # floats represent every integer up to here
#: Counts below this carry no weight next to one event (+1.0); they are not decayed further.
_NEGLIGIBLE = 1e-250


def _adds_exactly(total: float, count: int) -> bool:
    """Whether adding 1.0 to ``total >= 0`` ``count`` times has no rounding at any step.

    ``total`` is ``n / d`` in lowest terms (``d`` a power of two); every partial sum
    ``(n + i d) / d`` then has an odd numerator (or is an integer) at most ``n + count d``.
    """
    n, d = total.as_integer_ratio()
    return total >= 0.0 and n + count * d <= _EXACT


class _RequestKeys(list[OffloadKey]):
    """The keys one request used or stored, kept in its ReqContext until it finishes."""

    __slots__ = ()  # a list itself: one object per request


class KVAwareCachePolicy(CachePolicy):
    """KV-aware: learns reuse odds per block class online, evicts the least likely reused."""

    name = "kvaware"
    access_count_params = ("decay_window",)
    touches_misses = False  # ghost hits are recognised at insert

    def __init__(
        self,
        cache_capacity: int,
        *,
        short_output_tokens: int = 32,
        long_output_tokens: int = 128,
        horizon_factor: float = 1.0,
        ghost_factor: float = 8.0,
        decay_window: int = 0,
        prior_reuse: float = 0.3,
        prior_weight: float = 4.0,
    ) -> None:
        super().__init__(cache_capacity)
        for name, value in (
            ("short_output_tokens", short_output_tokens),
            ("long_output_tokens", long_output_tokens),
            ("decay_window", decay_window),
        ):
            check_int(name, value, 0)
        if long_output_tokens < short_output_tokens:
            raise ValueError(
                f"long_output_tokens ({long_output_tokens}) must be >= short_output_tokens "
                f"({short_output_tokens})"
            )
        horizon_factor = check_number("horizon_factor", horizon_factor, 0, low_open=True)
        prior_weight = check_number("prior_weight", prior_weight, 0, low_open=True)
        ghost_factor = check_number("ghost_factor", ghost_factor, 0)
        prior_reuse = check_number("prior_reuse", prior_reuse, 0, 1, low_open=True, high_open=True)
        self.short_output_tokens = short_output_tokens
        self.long_output_tokens = long_output_tokens
        self.horizon_factor = horizon_factor
        self.ghost_capacity = int(ghost_factor * cache_capacity)
        self.decay_window = decay_window or max(2000, 8 * cache_capacity)
        self.prior_reuse = prior_reuse
        self.prior_weight = prior_weight
        self._meta: dict[OffloadKey, _Meta] = {}
        self._orders: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(_NUM_CLASSES)
        ]
        self._ghosts: OrderedDict[OffloadKey, _Meta] = OrderedDict()  # evicted, oldest first
        self._reset_learning()

    def _reset_learning(self) -> None:
        self._entries = [self.prior_weight] * _NUM_CLASSES
        self._reuses = [self.prior_reuse * self.prior_weight] * _NUM_CLASSES
        self._gap_sums = [0.0] * _NUM_CLASSES
        self._since_decay = 0
        self._clock = 0.0  # logical clock, used when requests carry no timestamp
        self._now = 0.0
        self._rate_inserts = 0.0  # decayed inserts and elapsed time: the cache's turnover
        self._rate_time = 0.0
        self._last_insert_time = 0.0

    # ------------------------------------------------------------------ time
    def _advance(self, ctx: ReqContext | None, ticks: int) -> float:
        self._clock += ticks
        stamp = ctx.timestamp if ctx is not None else None
        if stamp is not None:
            if stamp > self._now:
                self._now = float(stamp)
        elif self._clock > self._now:
            self._now = self._clock
        return self._now

    def _horizon(self) -> float:
        """Capacity / insertion rate: how long the cache takes to turn over."""
        if self._rate_inserts <= 0.0 or self._rate_time <= 0.0:
            return 0.0
        return self.horizon_factor * self.cache_capacity * self._rate_time / self._rate_inserts

    # -------------------------------------------------------------- learning
    def _enter(self, cls: int) -> None:
        self._entries[cls] += 1.0
        self._since_decay += 1
        if self._since_decay >= self.decay_window:
            self._decay()

    def _decay(self) -> None:
        """Halve every count: the policy follows the traffic it sees now.

        A class whose entries have decayed below :data:`_NEGLIGIBLE` (about 830 halvings with
        no event) is left as it is: halving on would underflow its prior to ``0.0`` after
        about 1,075 and make its reuse odds ``0 / 0`` (a ``ZeroDivisionError`` in ``evict``
        and ``stats`` on a long-running cache, or soon with a small ``decay_window``).
        """
        self._since_decay = 0
        for i in range(_NUM_CLASSES):
            if self._entries[i] < _NEGLIGIBLE:
                continue
            self._entries[i] *= 0.5
            self._reuses[i] *= 0.5
            self._gap_sums[i] *= 0.5
        self._rate_inserts *= 0.5
        self._rate_time *= 0.5

    def _leave(self, cls: int) -> None:
        self._entries[cls] = max(self._entries[cls] - 1.0, self._reuses[cls])

    def _record_reuse(self, cls: int, gap: float) -> None:
        self._reuses[cls] += 1.0
        self._gap_sums[cls] += gap if gap > 0.0 else 0.0

    @staticmethod
    def _idle_at_or_below(params: tuple[float, float, float], ceiling: float) -> float:
        """The idle time from which a block of a class with ``params`` scores <= ``ceiling``.

        Inverts ``score = p w e / (1 - p + p e)``, ``e = exp(-idle / gap)``: scores fall as
        idle time grows. ``-inf`` when every block qualifies, ``inf`` when none does.
        """
        p, inv_gap, within = params
        if ceiling == math.inf or p * within <= ceiling:
            return -math.inf
        if inv_gap == 0.0 or ceiling <= 0.0:
            return math.inf
        survive = ceiling * (1.0 - p) / (p * (within - ceiling))
        return -math.log(survive) / inv_gap

    def _output_bucket(self, ctx: ReqContext) -> int:
        tokens = ctx.output_tokens
        if tokens is None:
            return _UNKNOWN_OUTPUT
        if tokens < self.short_output_tokens:
            return 0
        return 1 if tokens < self.long_output_tokens else 2

    @staticmethod
    def _remember(ctx: ReqContext | None, keys: Iterable[OffloadKey]) -> None:
        if ctx is None:
            return
        state = ctx.get_state(_RequestKeys)
        if state is None:
            state = _RequestKeys()
            ctx.set_state(state)
        state.extend(keys)

    # ------------------------------------------------------------ contract
    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        now = self._advance(req_context, 1)
        if self._rate_inserts > 0.0:
            self._rate_time += max(now - self._last_insert_time, 0.0)
        self._rate_inserts += 1.0
        self._last_insert_time = now
        ghost = self._ghosts.pop(key, None)
        if ghost is not None:  # an evicted block came back: its class was worth keeping
            ghost_cls, uses, _, last_use = ghost
            self._record_reuse(ghost_cls, now - last_use)
            uses += 1
            cls = _class_of(uses, _UNKNOWN_OUTPUT)
        else:
            uses = 0
            tail = req_context is not None and req_context.partial_tail_key == key
            cls = TAIL_CLASS if tail else _NEW_CLASS
        self._enter(cls)
        self._meta[key] = (cls, uses, _UNKNOWN_OUTPUT, now)
        if block.ref_cnt == 0:
            self._orders[cls][key] = None
        self._remember(req_context, (key,))

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        """Batched ``on_insert``, kept: it beats the base loop on the manager's prefix replay.

        (``tools/ab_versions.py``; figures in ``docs/benchmarks.md``.) Time, turnover and
        learning move exactly as one
        :meth:`on_insert` per key (closed forms only where they are exact, see
        :meth:`_advance_inserts`), so the decisions are the same.
        """
        tail = req_context.partial_tail_key if req_context is not None else None
        stamp = req_context.timestamp if req_context is not None else None
        metas: list[_Meta] | None = None
        if len(keys) > 1 and self._since_decay + len(keys) < self.decay_window:
            nows = self._advance_inserts(stamp, len(keys))
            if nows is not None:
                metas = self._new_metas(keys, nows, tail)
        if metas is None:
            metas = self._insert_loop(keys, stamp, tail)
        self._meta.update(zip(keys, metas, strict=True))
        if 0 in map(ref_count, blocks):  # usually none: the manager inserts pending blocks
            orders = self._orders
            for key, block, meta in zip(keys, blocks, metas, strict=True):
                if block.ref_cnt == 0:
                    orders[meta[_CLS]][key] = None
        self._remember(req_context, keys)

    def _insert_loop(
        self, keys: Sequence[OffloadKey], stamp: float | None, tail: bytes | None
    ) -> list[_Meta]:
        """The metadata of new blocks ``keys``, time and learning moved as one insert each."""
        ghosts, entries = self._ghosts, self._entries
        reuses, gap_sums = self._reuses, self._gap_sums
        width = len(_OUTPUT_NAMES)
        top = _COUNT_BUCKETS - 1
        # Time, turnover rate and decay move exactly as one insert call per key moves them.
        clock, now = self._clock, self._now
        rate_inserts, rate_time, last_insert = (
            self._rate_inserts,
            self._rate_time,
            self._last_insert_time,
        )
        since_decay, decay_window = self._since_decay, self.decay_window
        metas: list[_Meta] = []
        append = metas.append
        for key in keys:
            clock += 1
            if stamp is not None:
                if stamp > now:
                    now = float(stamp)
            elif clock > now:
                now = clock
            if rate_inserts > 0.0 and now > last_insert:
                rate_time += now - last_insert
            rate_inserts += 1.0
            last_insert = now
            ghost = ghosts.pop(key, None) if ghosts else None
            if ghost is None:
                cls = TAIL_CLASS if key == tail else _NEW_CLASS
                append((cls, 0, _UNKNOWN_OUTPUT, now))
            else:  # an evicted block came back: its class was worth keeping
                ghost_cls, uses, _, last_use = ghost
                reuses[ghost_cls] += 1.0  # _record_reuse, inline
                gap = now - last_use
                gap_sums[ghost_cls] += gap if gap > 0.0 else 0.0
                uses += 1
                cls = min(uses.bit_length(), top) * width + _UNKNOWN_OUTPUT
                append((cls, uses, _UNKNOWN_OUTPUT, now))
            entries[cls] += 1.0
            since_decay += 1
            if since_decay >= decay_window:
                self._rate_inserts, self._rate_time = rate_inserts, rate_time
                self._decay()
                since_decay = 0
                rate_inserts, rate_time = self._rate_inserts, self._rate_time
        self._since_decay = since_decay
        self._clock, self._now = clock, now
        self._rate_inserts, self._rate_time = rate_inserts, rate_time
        self._last_insert_time = last_insert
        return metas

    def _advance_inserts(self, stamp: float | None, count: int) -> Iterator[float] | None:
        """Time and turnover moved as ``count`` inserts move them, when that has a closed form.

        Returns each insert's time in order, or ``None`` (nothing changed) when the closed form
        might differ from one insert at a time in the last bit. The first insert is done as
        :meth:`insert` does it; after it, each insert adds one tick to the clock and 1.0 to
        the insert count, and either keeps the time (a timestamp: no elapsed time) or moves it
        and the elapsed insert time by the tick (no timestamp, the clock ahead). Those sums are
        done at once only when every partial sum is exact (then they equal the one-by-one sums).
        """
        clock, now = self._clock + 1, self._now
        if stamp is not None:
            if stamp > now:
                now = float(stamp)
        elif clock > now:
            now = clock
        rate_inserts, rate_time = self._rate_inserts, self._rate_time
        if rate_inserts > 0.0 and now > self._last_insert_time:
            rate_time += now - self._last_insert_time
        rate_inserts += 1.0
        more = count - 1
        if not (_adds_exactly(rate_inserts, more) and _adds_exactly(clock, more)):
            return None
        if stamp is not None:
            times: Iterator[float] = repeat(now, count)
            last = now
        elif now == clock:
            if not _adds_exactly(rate_time, more):
                return None
            times = count_from(now, 1.0)  # exact: integral clock values below 2**53
            last = now + more
            rate_time += more
        else:  # the time is ahead of the clock (an earlier timestamp): one at a time
            return None
        self._clock, self._now, self._last_insert_time = clock + more, last, last
        self._rate_inserts, self._rate_time = rate_inserts + more, rate_time
        return times

    def _new_metas(
        self, keys: Sequence[OffloadKey], nows: Iterator[float], tail: bytes | None
    ) -> list[_Meta]:
        """The metadata of new blocks ``keys`` inserted at times ``nows``, with the learning.

        No decay falls within (the caller checked), so only the counts move: ghosts' reuses
        in order, and one entry per key in its class.
        """
        ghosts, entries = self._ghosts, self._entries
        self._since_decay += len(keys)
        if (
            (not ghosts or ghosts.keys().isdisjoint(keys))
            and (tail is None or tail not in keys)
            and _adds_exactly(entries[_NEW_CLASS], len(keys))
        ):  # all brand new (the usual store): one class, one sum
            entries[_NEW_CLASS] += len(keys)
            return list(
                zip(repeat(_NEW_CLASS, len(keys)), repeat(0), repeat(_UNKNOWN_OUTPUT), nows)
            )
        reuses, gap_sums = self._reuses, self._gap_sums
        returned_top = _RETURNED_CLASS[-1]
        pop = ghosts.pop
        metas: list[_Meta] = []
        append = metas.append
        for key, now in zip(keys, nows, strict=False):  # nows may be endless
            ghost = pop(key, None)
            if ghost is None:
                cls = TAIL_CLASS if key == tail else _NEW_CLASS
                append((cls, 0, _UNKNOWN_OUTPUT, now))
            else:  # an evicted block came back: its class was worth keeping
                ghost_cls, uses, _, last_use = ghost
                reuses[ghost_cls] += 1.0  # _record_reuse, inline
                gap = now - last_use
                gap_sums[ghost_cls] += gap if gap > 0.0 else 0.0
                uses += 1
                cls = _RETURNED_CLASS[uses] if uses < _SATURATED else returned_top
                append((cls, uses, _UNKNOWN_OUTPUT, now))
            entries[cls] += 1.0
        return metas

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        meta = self._meta.pop(key)
        self._orders[meta[_CLS]].pop(key, None)
        self._leave(meta[_CLS])

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        blocks, orders, entries = self._meta, self._orders, self._entries
        statuses = self._blocks
        stored = [key for key in keys if key in blocks]
        if not stored:  # keys that are not stored mean nothing here (ghosts count at insert)
            return
        now = self._advance(req_context, len(stored))
        used: list[OffloadKey] = []
        reuses, gap_sums = self._reuses, self._gap_sums
        top = _USES_CLASS[_SATURATED]
        for key in reversed(stored):  # tail first, so the head ends most recent
            cls, uses, bucket, last_use = blocks[key]
            if statuses[key].ref_cnt >= 0:  # a use: a success for its class, a new trial after
                reuses[cls] += 1.0  # _record_reuse, inline
                gap = now - last_use
                gap_sums[cls] += gap if gap > 0.0 else 0.0
                uses += 1
                new = (_USES_CLASS[uses] if uses < _SATURATED else top) + bucket  # _class_of
                entries[new] += 1.0
                used.append(key)
                if new != cls:  # into the new class's order, appended last: no move to make
                    if orders[cls].pop(key, 0) is None:
                        orders[new][key] = None
                    blocks[key] = (new, uses, bucket, now)
                    continue
            order = orders[cls]
            if key in order:
                order.move_to_end(key)
            blocks[key] = (cls, uses, bucket, now)
        self._since_decay += len(used)
        if self._since_decay >= self.decay_window:
            self._decay()
        self._remember(req_context, used)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestKeys)
        if state is None:
            return
        bucket = self._output_bucket(req_context)
        if bucket == _UNKNOWN_OUTPUT:
            state.clear()
            return
        blocks, orders = self._meta, self._orders
        entries, reuses = self._entries, self._reuses
        classes = _BUCKET_CLASSES[bucket]
        top = classes[_SATURATED]
        moved = 0
        for key, meta in zip(reversed(state), map(blocks.get, reversed(state)), strict=True):
            if meta is None:
                continue
            old, uses, _, last_use = meta
            if old == TAIL_CLASS:
                continue
            new = classes[uses] if uses < _SATURATED else top
            if new == old:  # same class, so the same bucket: the metadata stays as it is
                continue
            blocks[key] = (new, uses, bucket, last_use)
            # A correction, not a new trial: the entry moves from the provisional class.
            entries[old] = max(entries[old] - 1.0, reuses[old])
            entries[new] += 1.0
            moved += 1
            if orders[old].pop(key, 0) is None:
                orders[new][key] = None
        state.clear()
        self._since_decay += moved
        if self._since_decay >= self.decay_window:
            self._decay()

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        orders = self._orders
        if n > sum(map(len, orders)):
            return None
        blocks = self._meta
        now = self._now
        horizon = self._horizon()
        exp, expm1 = math.exp, math.expm1
        entries, reuses_of, gap_sums = self._entries, self._reuses, self._gap_sums
        # Per candidate class: its order's iterator, past its first unprotected key (the
        # candidate); its score parameters: its reuse odds p, 1 / mean gap (0: no gap model)
        # and P(gap < H); and (score, class, candidate) on the heap, scored as score() does.
        iterators: dict[int, Iterator[OffloadKey]] = {}
        params: dict[int, tuple[float, float, float]] = {}
        heap: list[tuple[float, int, OffloadKey]] = []
        for cls in compress(range(_NUM_CLASSES), orders):  # the non-empty ones
            iterator = iter(orders[cls])
            for head in iterator:
                if head not in protected:
                    break
            else:  # all of it protected
                continue
            iterators[cls] = iterator
            reuses, gap_sum = reuses_of[cls], gap_sums[cls]
            p = reuses / entries[cls]
            if p > 0.999:  # min(p, 0.999) without the call
                p = 0.999
            if reuses <= 0.0 or horizon <= 0.0 or gap_sum <= 0.0:
                params[cls] = (p, 0.0, 1.0)
                heap.append((p, cls, head))
                continue
            inv_gap = reuses / gap_sum
            within = -expm1(-horizon * inv_gap)
            params[cls] = (p, inv_gap, within)
            idle = now - blocks[head][_LAST_USE]
            survive = exp(-idle * inv_gap) if idle > 0.0 else 1.0
            heap.append((p * survive * within / (1.0 - p + p * survive), cls, head))

        def score(cls: int, key: OffloadKey) -> float:
            p, inv_gap, within = params[cls]
            if inv_gap == 0.0:
                return p
            idle = now - blocks[key][_LAST_USE]
            survive = exp(-idle * inv_gap) if idle > 0.0 else 1.0
            return p * survive * within / (1.0 - p + p * survive)

        # Classes are distinct, so the heap orders by score, ties to the lower class index.
        heapq.heapify(heap)
        chosen: list[OffloadKey] = []
        while len(chosen) < n:
            if not heap:
                return None
            _, best, head = heap[0]
            # The best class's later candidates are newer, so their scores only grow: take
            # them while they stay at or below the runner-up's score, found by idle time alone.
            runner_up = min(heap[1:3])[0] if len(heap) > 1 else math.inf
            min_idle = self._idle_at_or_below(params[best], runner_up)
            chosen.append(head)
            iterator = iterators[best]
            if min_idle == -math.inf:  # the whole class scores below: no idle times to read
                need = n - len(chosen)
                if need:
                    batch = list(islice(iterator, need))
                    if not protected or protected_disjoint(protected, batch):  # the usual case
                        chosen += batch
                        if len(batch) < need:  # the class ran out
                            heapq.heappop(heap)
                        continue
                    chosen += [key for key in batch if key not in protected]
                    if len(chosen) < n:
                        for key in iterator:
                            if key not in protected:
                                chosen.append(key)
                                if len(chosen) == n:
                                    break
                        else:  # the class ran out
                            heapq.heappop(heap)
                continue
            # Take candidates up to the first one idle for less than min_idle (the class's next
            # candidate), as if none were protected: they seldom are, checked after at once.
            start = len(chosen)
            candidate: OffloadKey | None = None
            for candidate in islice(iterator, n - start):
                if now - blocks[candidate][_LAST_USE] < min_idle:
                    break
                chosen.append(candidate)
            else:  # taken all it could (chosen is full) or the class ran out
                candidate = None
            if protected:
                scanned = chosen[start:] if candidate is None else [*chosen[start:], candidate]
                if not protected_disjoint(protected, scanned):  # again, stepping over those
                    del chosen[start:]
                    iterator = iterators[best] = chain(scanned, iterator)
                    for candidate in iterator:
                        if candidate in protected:
                            continue
                        if len(chosen) == n or now - blocks[candidate][_LAST_USE] < min_idle:
                            break
                        chosen.append(candidate)
                    else:  # the class ran out
                        candidate = None
            if candidate is None:
                if len(chosen) < n:  # the class ran out
                    heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (score(best, candidate), best, candidate))
        pop = blocks.pop
        if self.ghost_capacity > 0:
            ghosts = self._ghosts
            for key in chosen:
                meta = ghosts[key] = pop(key)
                del orders[meta[_CLS]][key]
            excess = len(ghosts) - self.ghost_capacity
            if excess > 0:
                for key in list(islice(ghosts, excess)):
                    del ghosts[key]
        else:
            for key in chosen:
                del orders[pop(key)[_CLS]][key]
        return chosen

    def on_clear(self) -> None:
        self._meta.clear()
        for order in self._orders:
            order.clear()
        self._ghosts.clear()
        self._reset_learning()

    def mark_evictable(self, key: OffloadKey) -> None:
        meta = self._meta.get(key)
        if meta is not None:
            order = self._orders[meta[_CLS]]
            order[key] = None
            order.move_to_end(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """Batched ``mark_evictable`` (one lookup per key, no method call per key)."""
        meta_of, orders = self._meta.get, self._orders
        for key in keys:
            meta = meta_of(key)
            if meta is not None:
                order = orders[meta[_CLS]]
                if key in order:
                    order.move_to_end(key)
                else:
                    order[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        meta = self._meta.get(key)
        if meta is not None:
            self._orders[meta[_CLS]].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        out: dict[str, float] = {"ghosts": len(self._ghosts), "horizon": self._horizon()}
        for cls, name in enumerate(CLASS_NAMES):
            out[f"p_{name}"] = self._reuses[cls] / self._entries[cls]
        return out
