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

import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping

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

    def _score(self, cls: int, idle: float, horizon: float) -> float:
        reuses = self._reuses[cls]
        p = reuses / self._entries[cls]
        if p >= 1.0:
            p = 0.999
        if reuses <= 0.0 or horizon <= 0.0:
            return p
        mean_gap = self._gap_sums[cls] / reuses
        if mean_gap <= 0.0:
            return p
        survive = math.exp(-idle / mean_gap) if idle > 0.0 else 1.0
        return p * survive * -math.expm1(-horizon / mean_gap) / (1.0 - p + p * survive)

    def _output_bucket(self, ctx: ReqContext) -> int:
        tokens = ctx.output_tokens
        if tokens is None:
            return _UNKNOWN_OUTPUT
        if tokens < self.short_output_tokens:
            return 0
        return 1 if tokens < self.long_output_tokens else 2

    def _move(self, key: OffloadKey, block: _Block, cls: int, *, correction: bool) -> None:
        """Put ``block`` in class ``cls`` as a new entry (a reuse starts a new trial).

        A correction (the request's output length became known) takes back the entry into
        the provisional class instead of counting a second trial.
        """
        if correction:
            if cls == block.cls:
                return
            self._leave(block.cls)
        self._enter(cls)
        if cls == block.cls:
            return
        evictable = self._orders[block.cls].pop(key, 0) is None
        block.cls = cls
        if evictable:
            self._orders[cls][key] = None

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
        block = self._blocks.get(key)
        return block.status if block is not None else None

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
        if block.ref_cnt == 0:
            self._orders[cls][key] = None
        self._remember(req_context, (key,))

    def remove(self, key: OffloadKey) -> None:
        block = self._blocks.pop(key, None)
        if block is not None:
            self._orders[block.cls].pop(key, None)
            self._leave(block.cls)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        key_list = keys if isinstance(keys, (list, tuple)) else list(keys)
        now = self._advance(req_context, len(key_list))
        blocks = self._blocks
        used: list[OffloadKey] = []
        for key in reversed(key_list):  # tail first, so the head ends most recent
            block = blocks.get(key)
            if block is None:
                continue
            if block.status.ref_cnt >= 0:
                self._record_reuse(block.cls, now - block.last_use)
                block.uses += 1
                self._move(key, block, _class_of(block.uses, block.output_bucket), correction=False)
                used.append(key)
            order = self._orders[block.cls]
            if key in order:
                order.move_to_end(key)
            block.last_use = now
        self._remember(req_context, used)

    def on_request_finished(self, req_context: ReqContext) -> None:
        state = req_context.get_state(_RequestKeys)
        if state is None:
            return
        keys, state.keys = state.keys, []
        bucket = self._output_bucket(req_context)
        if bucket == _UNKNOWN_OUTPUT:
            return
        blocks = self._blocks
        for key in reversed(keys):
            block = blocks.get(key)
            if block is None or block.cls == TAIL_CLASS:
                continue
            block.output_bucket = bucket
            self._move(key, block, _class_of(block.uses, bucket), correction=True)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        orders = self._orders
        if n > sum(len(order) for order in orders):
            return None
        blocks = self._blocks
        now = self._now
        horizon = self._horizon()
        score = self._score
        iterators = [iter(order) for order in orders]
        heads = [_next_unprotected(it, protected) for it in iterators]
        scores = [
            score(cls, now - blocks[key].last_use, horizon) if key is not None else math.inf
            for cls, key in enumerate(heads)
        ]
        chosen: list[OffloadKey] = []
        for _ in range(n):
            best = min(range(_NUM_CLASSES), key=scores.__getitem__)
            key = heads[best]
            if key is None:
                return None
            chosen.append(key)
            nxt = _next_unprotected(iterators[best], protected)
            heads[best] = nxt
            scores[best] = (
                score(best, now - blocks[nxt].last_use, horizon) if nxt is not None else math.inf
            )
        victims: Victims = []
        ghosts = self._ghosts
        keep_ghosts = self.ghost_capacity > 0
        for key in chosen:
            block = blocks.pop(key)
            del orders[block.cls][key]
            victims.append((key, block.status))
            if keep_ghosts:
                ghosts[key] = (block.cls, block.uses, block.last_use)
        while len(ghosts) > self.ghost_capacity:
            ghosts.popitem(last=False)
        return victims

    def clear(self) -> None:
        self._blocks.clear()
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

    def mark_non_evictable(self, key: OffloadKey) -> None:
        block = self._blocks.get(key)
        if block is not None:
            self._orders[block.cls].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        out: dict[str, float] = {"ghosts": len(self._ghosts), "horizon": self._horizon()}
        for cls, name in enumerate(CLASS_NAMES):
            out[f"p_{name}"] = self._reuses[cls] / self._entries[cls]
        return out
