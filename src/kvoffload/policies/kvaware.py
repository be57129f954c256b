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

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims

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


class _Block:
    """Per-block metadata: its class, use count and when it was last used."""

    __slots__ = ("cls", "last_use", "output_bucket", "status", "uses")

    def __init__(self, status: BlockStatus, cls: int, uses: int, last_use: float) -> None:
        self.status = status
        self.cls = cls
        self.uses = uses
        self.output_bucket = _UNKNOWN_OUTPUT
        self.last_use = last_use


class _RequestKeys:
    """The keys one request used or stored, kept in its ReqContext until it finishes."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys: list[OffloadKey] = []


def _next_unprotected(
    it: Iterator[OffloadKey], protected: Collection[OffloadKey]
) -> OffloadKey | None:
    for key in it:
        if key not in protected:
            return key
    return None


class KVAwareCachePolicy(CachePolicy):
    """KV-aware: learns reuse odds per block class online, evicts the least likely reused."""

    name = "kvaware"
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
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if long_output_tokens < short_output_tokens:
            raise ValueError(
                f"long_output_tokens ({long_output_tokens}) must be >= short_output_tokens "
                f"({short_output_tokens})"
            )
        for name, number in (("horizon_factor", horizon_factor), ("prior_weight", prior_weight)):
            if not number > 0:
                raise ValueError(f"{name} must be > 0, got {number!r}")
        if not ghost_factor >= 0:
            raise ValueError(f"ghost_factor must be >= 0, got {ghost_factor!r}")
        if not 0.0 < prior_reuse < 1.0:
            raise ValueError(f"prior_reuse must be in (0, 1), got {prior_reuse!r}")
        self.short_output_tokens = short_output_tokens
        self.long_output_tokens = long_output_tokens
        self.horizon_factor = horizon_factor
        self.ghost_capacity = int(ghost_factor * cache_capacity)
        self.decay_window = decay_window or max(2000, 8 * cache_capacity)
        self.prior_reuse = prior_reuse
        self.prior_weight = prior_weight
        self._blocks: dict[OffloadKey, _Block] = {}
        self._statuses: dict[OffloadKey, BlockStatus] = {}  # the block table the manager reads
        self._orders: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(_NUM_CLASSES)
        ]
        self._ghosts: OrderedDict[OffloadKey, tuple[int, int, float]] = OrderedDict()
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
        """Halve every count: the policy follows the traffic it sees now."""
        self._since_decay = 0
        for i in range(_NUM_CLASSES):
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

    def _score_params(self, cls: int, horizon: float) -> tuple[float, float, float]:
        """Class ``cls``'s reuse odds ``p``, ``1 / mean gap`` (0 = no gap model), P(gap < H)."""
        reuses, gap_sum = self._reuses[cls], self._gap_sums[cls]
        p = min(reuses / self._entries[cls], 0.999)
        if reuses <= 0.0 or horizon <= 0.0 or gap_sum <= 0.0:
            return p, 0.0, 1.0
        inv_gap = reuses / gap_sum
        return p, inv_gap, -math.expm1(-horizon * inv_gap)

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
        state.keys.extend(keys)

    # ------------------------------------------------------------ contract
    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self._statuses.get(key)

    @property
    def block_table(self) -> Mapping[OffloadKey, BlockStatus]:
        return self._statuses

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        now = self._advance(req_context, 1)
        if self._rate_inserts > 0.0:
            self._rate_time += max(now - self._last_insert_time, 0.0)
        self._rate_inserts += 1.0
        self._last_insert_time = now
        ghost = self._ghosts.pop(key, None)
        if ghost is not None:  # an evicted block came back: its class was worth keeping
            ghost_cls, uses, last_use = ghost
            self._record_reuse(ghost_cls, now - last_use)
            uses += 1
            cls = _class_of(uses, _UNKNOWN_OUTPUT)
        else:
            uses = 0
            tail = req_context is not None and req_context.partial_tail_key == key
            cls = TAIL_CLASS if tail else _class_of(0, _UNKNOWN_OUTPUT)
        self._enter(cls)
        self._blocks[key] = _Block(block, cls, uses, now)
        self._statuses[key] = block
        if block.ref_cnt == 0:
            self._orders[cls][key] = None
        self._remember(req_context, (key,))

    def insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        if type(self).insert is not KVAwareCachePolicy.insert:  # a subclass hooks insert
            super().insert_many(keys, blocks, req_context)
            return
        ghosts, stored, statuses = self._ghosts, self._blocks, self._statuses
        orders, entries = self._orders, self._entries
        tail = req_context.partial_tail_key if req_context is not None else None
        stamp = req_context.timestamp if req_context is not None else None
        new_cls = _class_of(0, _UNKNOWN_OUTPUT)
        width = len(_OUTPUT_NAMES)
        top = _COUNT_BUCKETS - 1
        # Time, turnover rate and decay move exactly as one insert call per key moves them.
        clock, now = self._clock, self._now
        rate_inserts, rate_time, last_insert = (
            self._rate_inserts,
            self._rate_time,
            self._last_insert_time,
        )
        for key, block in zip(keys, blocks, strict=True):
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
                uses = 0
                cls = TAIL_CLASS if key == tail else new_cls
            else:  # an evicted block came back: its class was worth keeping
                ghost_cls, uses, last_use = ghost
                self._record_reuse(ghost_cls, now - last_use)
                uses += 1
                cls = min(uses.bit_length(), top) * width + _UNKNOWN_OUTPUT
            entries[cls] += 1.0
            self._since_decay += 1
            if self._since_decay >= self.decay_window:
                self._rate_inserts, self._rate_time = rate_inserts, rate_time
                self._decay()
                rate_inserts, rate_time = self._rate_inserts, self._rate_time
            stored[key] = _Block(block, cls, uses, now)
            statuses[key] = block
            if block.ref_cnt == 0:
                orders[cls][key] = None
        self._clock, self._now = clock, now
        self._rate_inserts, self._rate_time = rate_inserts, rate_time
        self._last_insert_time = last_insert
        self._remember(req_context, keys)

    def remove(self, key: OffloadKey) -> None:
        block = self._blocks.pop(key, None)
        if block is not None:
            del self._statuses[key]
            self._orders[block.cls].pop(key, None)
            self._leave(block.cls)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        blocks, orders, entries = self._blocks, self._orders, self._entries
        stored = [key for key in keys if key in blocks]
        if not stored:  # keys that are not stored mean nothing here (ghosts count at insert)
            return
        now = self._advance(req_context, len(stored))
        used: list[OffloadKey] = []
        for key in reversed(stored):  # tail first, so the head ends most recent
            block = blocks[key]
            old = block.cls
            if block.status.ref_cnt >= 0:  # a use: a success for its class, a new trial after
                self._record_reuse(old, now - block.last_use)
                block.uses += 1
                new = _class_of(block.uses, block.output_bucket)
                entries[new] += 1.0
                self._since_decay += 1
                if new != old:
                    block.cls = new
                    if orders[old].pop(key, 0) is None:
                        orders[new][key] = None
                used.append(key)
            order = orders[block.cls]
            if key in order:
                order.move_to_end(key)
            block.last_use = now
        if self._since_decay >= self.decay_window:
            self._decay()
        self._remember(req_context, used)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestKeys)
        if state is None:
            return
        keys, state.keys = state.keys, []
        bucket = self._output_bucket(req_context)
        if bucket == _UNKNOWN_OUTPUT:
            return
        blocks, orders = self._blocks, self._orders
        entries, reuses = self._entries, self._reuses
        moved = 0
        for key in reversed(keys):
            block = blocks.get(key)
            if block is None or block.cls == TAIL_CLASS:
                continue
            block.output_bucket = bucket
            old, new = block.cls, _class_of(block.uses, bucket)
            if new == old:
                continue
            # A correction, not a new trial: the entry moves from the provisional class.
            entries[old] = max(entries[old] - 1.0, reuses[old])
            entries[new] += 1.0
            moved += 1
            block.cls = new
            if orders[old].pop(key, 0) is None:
                orders[new][key] = None
        self._since_decay += moved
        if self._since_decay >= self.decay_window:
            self._decay()

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        orders = self._orders
        if n > sum(len(order) for order in orders):
            return None
        blocks = self._blocks
        now = self._now
        horizon = self._horizon()
        iterators = [iter(order) for order in orders]
        heads = [_next_unprotected(it, protected) for it in iterators]
        params = {
            cls: self._score_params(cls, horizon)
            for cls, key in enumerate(heads)
            if key is not None
        }
        exp = math.exp

        def score(cls: int, key: OffloadKey) -> float:
            p, inv_gap, within = params[cls]
            if inv_gap == 0.0:
                return p
            idle = now - blocks[key].last_use
            survive = exp(-idle * inv_gap) if idle > 0.0 else 1.0
            return p * survive * within / (1.0 - p + p * survive)

        # (score, class) of every class's oldest candidate; ties go to the lower class index.
        heap = [(score(cls, key), cls) for cls, key in enumerate(heads) if key is not None]
        heapq.heapify(heap)
        chosen: list[OffloadKey] = []
        while len(chosen) < n:
            if not heap:
                return None
            best = heap[0][1]
            # The best class's later candidates are newer, so their scores only grow: take
            # them while they stay at or below the runner-up's score, found by idle time alone.
            runner_up = min(heap[1:3])[0] if len(heap) > 1 else math.inf
            min_idle = self._idle_at_or_below(params[best], runner_up)
            iterator = iterators[best]
            key = heads[best]
            while True:
                chosen.append(key)  # type: ignore[arg-type]
                key = next(iterator, None)
                while key is not None and key in protected:
                    key = next(iterator, None)
                if key is None or len(chosen) == n or now - blocks[key].last_use < min_idle:
                    break
            heads[best] = key
            if key is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (score(best, key), best))
        victims: Victims = []
        ghosts = self._ghosts
        keep_ghosts = self.ghost_capacity > 0
        statuses = self._statuses
        for key in chosen:
            block = blocks.pop(key)
            del statuses[key]
            del orders[block.cls][key]
            victims.append((key, block.status))
            if keep_ghosts:
                ghosts[key] = (block.cls, block.uses, block.last_use)
        while len(ghosts) > self.ghost_capacity:
            ghosts.popitem(last=False)
        return victims

    def clear(self) -> None:
        self._blocks.clear()
        self._statuses.clear()
        for order in self._orders:
            order.clear()
        self._ghosts.clear()
        self._reset_learning()

    def mark_evictable(self, key: OffloadKey) -> None:
        block = self._blocks.get(key)
        if block is not None:
            order = self._orders[block.cls]
            order[key] = None
            order.move_to_end(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        if type(self).mark_evictable is not KVAwareCachePolicy.mark_evictable:  # a subclass hook
            super().mark_evictable_many(keys)
            return
        blocks, orders = self._blocks, self._orders
        for key in keys:
            block = blocks.get(key)
            if block is not None:
                order = orders[block.cls]
                if key in order:
                    order.move_to_end(key)
                else:
                    order[key] = None

    def mark_non_evictable(self, key: OffloadKey) -> None:
        block = self._blocks.get(key)
        if block is not None:
            self._orders[block.cls].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        out: dict[str, float] = {"ghosts": len(self._ghosts), "horizon": self._horizon()}
        for cls, name in enumerate(CLASS_NAMES):
            out[f"p_{name}"] = self._reuses[cls] / self._entries[cls]
        return out
