"""MQ, the Multi-Queue policy (Zhou, Philbin & Li, USENIX ATC'01) for second-level caches.

A second-level cache (an offload tier sits behind the GPU's own prefix cache) sees re-uses at
long distances, so recency alone forgets blocks too early. MQ keeps ``num_queues`` LRU queues;
a block with access count ``f`` lives in queue ``min(floor(log2 f), num_queues - 1)``. Every
queued block carries an expiry time ``now + lifetime``; after each access the LRU block of each
queue ``k >= 1`` whose expiry has passed drops to the MRU end of queue ``k - 1`` (with a fresh
expiry), so blocks that were hot once cool down. Eviction takes the LRU block of the lowest
non-empty queue and remembers its key and access count in the ghost FIFO Qout
(``int(capacity * qout_ratio)`` keys); a block that comes back from Qout resumes its count.

Time is libCacheSim 0.3.5's: the clock advances by one on every hit and every stored block (not
on a miss that is not stored), and the expiry check runs right after. A store counts when its
write completes (``mark_evictable`` after ``insert``): that is when the block joins its queue,
so blocks demoted by that clock tick land behind it, exactly as when libCacheSim inserts. Driven
one block at a time without pins this policy makes exactly libCacheSim's ``MQ`` decisions.

Protocol notes: a Qout hit is recognised in ``touch`` (the ghost leaves Qout before the eviction
that makes room, as in libCacheSim) and its count is applied by the ``insert`` that follows.
Pinned and pending blocks are not in the queues' eviction orders and are not demoted while
pinned; a block that becomes evictable again re-enters its queue at the MRU end.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload._checks import check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import first_unprotected, protected_disjoint

_NEVER = float("inf")


class MQCachePolicy(CachePolicy):
    """Multi-Queue (ATC'01): LRU queues by access count, with lifetime-based demotion."""

    name = "mq"
    access_count_params = ("lifetime",)

    def __init__(
        self,
        cache_capacity: int,
        *,
        num_queues: int = 8,
        lifetime: int = 10000,
        qout_ratio: float = 4.0,
    ) -> None:
        super().__init__(cache_capacity)
        self.num_queues = check_int("num_queues", num_queues, 1, 64)
        self.lifetime = check_int("lifetime", lifetime, 1, 2**62)
        self.qout_ratio = check_number("qout_ratio", qout_ratio, 0, 64, why=" (ghosts per block)")
        self._qout_limit = int(cache_capacity * self.qout_ratio)
        # Resident blocks, one plain dict per field (cheaper than an object per block):
        self._freq: dict[OffloadKey, int] = {}  # access count
        # Queue index; ``~index`` (negative) until the store's write completes, which is when
        # its insertion is counted.
        self._queue: dict[OffloadKey, int] = {}
        # Expiry time of each written block above queue 0 (only those are ever demoted).
        self._expire: dict[OffloadKey, int] = {}
        # Evictable blocks per queue, LRU first.
        self._queues: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(num_queues)
        ]
        self._qout: OrderedDict[OffloadKey, int] = OrderedDict()  # ghost -> count, oldest first
        self._revived: OrderedDict[OffloadKey, int] = OrderedDict()  # Qout hits awaiting insert
        self._now = 0
        # Per queue, a lower bound of its LRU block's expiry (queue 0, never demoted, and an
        # empty queue: never), so a demotion looks only at the queues whose bound has passed.
        self._bounds: list[float] = [_NEVER] * num_queues
        # At most the least bound: until the clock passes it, a tick has nothing to demote.
        self._horizon: float = _NEVER

    def _queue_for(self, freq: int) -> int:
        return min(freq.bit_length() - 1, self.num_queues - 1)

    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        self._insert(key)
        if block.ref_cnt >= 0:  # inserted ready: the store is complete now
            self._complete_store(key)

    def _insert(self, key: OffloadKey) -> None:
        past = self._revived.pop(key, None)
        ghost = self._qout.pop(key, None)  # inserted without a touch: still a Qout hit
        freq = (past if past is not None else ghost if ghost is not None else 0) + 1
        self._freq[key] = freq
        self._queue[key] = ~self._queue_for(freq)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        freqs, queue_of = self._freq, self._queue
        revived, qout = self._revived, self._qout
        last_queue = self.num_queues - 1
        ready = False
        for key, block in zip(keys, blocks, strict=True):
            if key in revived:  # a Qout hit seen by touch: its count resumes (_insert, inlined)
                freq = freqs[key] = revived.pop(key) + 1
                qout.pop(key, None)
            elif key in qout:  # inserted without a touch: still a Qout hit
                freq = freqs[key] = qout.pop(key) + 1
            else:  # a new block: count 1, queue 0, write pending
                freqs[key] = 1
                queue_of[key] = -1
                if block.ref_cnt >= 0:
                    ready = True
                continue
            queue = freq.bit_length() - 1
            queue_of[key] = ~(queue if queue < last_queue else last_queue)
            if block.ref_cnt >= 0:
                ready = True
        if ready:  # inserted ready: those stores are complete now (nothing above reads them)
            for key, block in zip(keys, blocks, strict=True):
                if block.ref_cnt >= 0:
                    self._complete_store(key)

    def _complete_store(self, key: OffloadKey) -> None:
        """The insertion "access": queue the block, start its lifetime, advance the clock."""
        queue = self._queue[key] = ~self._queue[key]
        if queue:
            self._expire[key] = self._now + self.lifetime
        if self._blocks[key].ref_cnt == 0:
            self._enqueue(key, queue)
        self._tick()

    def _enqueue(self, key: OffloadKey, queue: int) -> None:
        """Put ``key`` at ``queue``'s MRU end (the queue's LRU block changes if it was empty)."""
        self._queues[queue][key] = None
        if queue:
            self._lower_bound(queue, self._expire[key])

    def _lower_bound(self, queue: int, expire: float) -> None:
        """``queue``'s LRU block may expire at ``expire`` now: keep its bound below that."""
        if expire < self._bounds[queue]:
            self._bounds[queue] = expire
            if expire < self._horizon:
                self._horizon = expire

    def _dequeue(self, key: OffloadKey, queue: int) -> bool:
        """Take ``key`` out of ``queue``'s order; False if it was not there."""
        order = self._queues[queue]
        if order.pop(key, 0) is not None:
            return False
        if queue and order:  # the queue's LRU block may have changed
            self._lower_bound(queue, self._expire[next(iter(order))])
        return True

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        queue = self._queue.pop(key)
        if queue >= 0:
            self._dequeue(key, queue)
        del self._freq[key]
        self._expire.pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        freqs, qout = self._freq, self._qout
        if not freqs.keys().isdisjoint(keys):  # some are stored: walk them all, in order
            self._hits(keys)
            return
        # No hits: only Qout is involved. Qout hits are recorded in walk order, trimmed after.
        if qout and not qout.keys().isdisjoint(keys):
            revived = self._revived
            for key in reversed(keys):
                if key in qout:
                    revived[key] = qout.pop(key)
            for _ in range(len(revived) - max(1, self.cache_capacity)):
                revived.popitem(False)

    def _revive(self, key: OffloadKey) -> None:
        """A Qout hit: keep its count for the insert that follows."""
        revived = self._revived
        revived[key] = self._qout.pop(key)
        if len(revived) > max(1, self.cache_capacity):
            revived.popitem(False)

    def _hits(self, keys: Sequence[OffloadKey]) -> None:
        """Touch ``keys`` tail first: a hit counts, moves to its queue's MRU end and ticks.

        The hit is inlined (a prefix hit is the commonest access) with the clock and the
        horizon in locals, written back before :meth:`_demote`, the one thing that reads them.
        """
        freqs, queue_of, expires, qout = self._freq, self._queue, self._expire, self._qout
        queues, bounds = self._queues, self._bounds
        last_queue = self.num_queues - 1
        lifetime = self.lifetime
        now, horizon = self._now, self._horizon
        for key in reversed(keys):
            freq = freqs.get(key)
            if freq is None:
                if key in qout:
                    self._revive(key)
                continue
            freq = freqs[key] = freq + 1
            queue = freq.bit_length() - 1
            if queue > last_queue:
                queue = last_queue
            expire = now + lifetime
            if queue:
                expires[key] = expire
            old = queue_of[key]
            if old < 0:  # write pending: not queued; the count and queue still change
                queue_of[key] = ~queue
            else:
                queue_of[key] = queue
                order = queues[old]
                if order.pop(key, 0) is None:  # it was evictable: it goes to the MRU end
                    queues[queue][key] = None
                    if old and order:  # the old queue's LRU block may have changed
                        head = expires[next(iter(order))]
                        if head < bounds[old]:
                            bounds[old] = head
                            if head < horizon:
                                horizon = head
                    if queue and expire < bounds[queue]:
                        bounds[queue] = expire
                        if expire < horizon:
                            horizon = expire
            now += 1
            if now > horizon:
                self._now = now
                self._demote(now)
                horizon = self._horizon
        self._now, self._horizon = now, horizon

    def _tick(self) -> None:
        """Advance the clock; demote each queue's LRU block whose lifetime has run out."""
        self._now += 1
        if self._now > self._horizon:
            self._demote(self._now)

    def _demote(self, now: int) -> None:
        """Demote each queue's LRU block that expired before ``now``; recompute the horizon.

        Only queues whose bound has passed are looked at (usually one of them): their bound
        becomes their LRU block's expiry exactly.
        """
        queues, queue_of, expires, bounds = self._queues, self._queue, self._expire, self._bounds
        renewed = now + self.lifetime
        for k in range(1, self.num_queues):
            if bounds[k] >= now:  # its LRU block has not expired
                continue
            order = queues[k]
            if not order:
                bounds[k] = _NEVER
                continue
            key = next(iter(order))
            expire = expires[key]
            if expire < now:
                del order[key]
                queues[k - 1][key] = None
                queue_of[key] = k - 1
                if k > 1:
                    expires[key] = renewed
                    if renewed < bounds[k - 1]:  # it may be queue k - 1's LRU block now
                        bounds[k - 1] = renewed
                else:
                    del expires[key]
                bounds[k] = expires[next(iter(order))] if order else _NEVER
            else:
                bounds[k] = expire
        self._horizon = min(bounds)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        # The usual case: the n least recent blocks of the lowest queues, none protected.
        queues = self._queues
        chosen: list[OffloadKey] = []
        taken: list[tuple[int, list[OffloadKey]]] = []  # (queue, its LRU blocks taken)
        for queue, order in enumerate(queues):
            if order:
                keys = list(islice(order, n - len(chosen)))
                taken.append((queue, keys))
                chosen += keys
                if len(chosen) == n:
                    break
        else:
            return None
        if protected and not protected_disjoint(protected, chosen):
            found = first_unprotected(queues, n, protected)
            if found is None:
                return None
            chosen = found
            by_queue: dict[int, list[OffloadKey]] = {}
            queue_of = self._queue
            for key in chosen:
                by_queue.setdefault(queue_of[key], []).append(key)
            taken = list(by_queue.items())
        above = False
        for queue, keys in taken:
            order = queues[queue]
            for key in keys:
                del order[key]
            if queue:
                above = True
                if order:  # the queue's LRU block changed
                    self._lower_bound(queue, self._expire[next(iter(order))])
        self._forget_victims(chosen, above)
        return chosen

    def _forget_victims(self, chosen: list[OffloadKey], above: bool) -> None:
        """Forget the chosen (already unqueued) blocks, remember them in Qout."""
        freqs, queue_of, qout = self._freq, self._queue, self._qout
        if self._qout_limit > 0:
            for key in chosen:
                qout[key] = freqs.pop(key)
                del queue_of[key]
            for _ in range(len(qout) - self._qout_limit):
                qout.popitem(False)
        else:
            for key in chosen:
                del freqs[key], queue_of[key]
        if above:
            pop_expire = self._expire.pop
            for key in chosen:
                pop_expire(key, None)

    def on_clear(self) -> None:
        for table in (self._freq, self._queue, self._expire):
            table.clear()
        for order in self._queues:
            order.clear()
        self._qout.clear()
        self._revived.clear()
        self._now = 0
        self._bounds = [_NEVER] * self.num_queues
        self._horizon = _NEVER

    def mark_evictable(self, key: OffloadKey) -> None:
        queue = self._queue.get(key)
        if queue is None:
            return
        if queue < 0:
            self._complete_store(key)
            return
        order = self._queues[queue]
        if key in order:
            order.move_to_end(key)
        else:
            self._enqueue(key, queue)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        queue_of, queues, statuses, expires = self._queue, self._queues, self._blocks, self._expire
        bounds, first = self._bounds, queues[0]
        lifetime = self.lifetime
        # The clock and the horizon in locals; written back before anything that reads them.
        now, horizon = self._now, self._horizon
        for key in keys:
            queue = queue_of.get(key)
            if queue is None:
                continue
            if queue >= 0:  # a load finished: back to its queue's MRU end
                order = queues[queue]
                if key in order:
                    order.move_to_end(key)
                    continue
                order[key] = None
                if queue:
                    expire = expires[key]
                    if expire < bounds[queue]:
                        bounds[queue] = expire
                        if expire < horizon:
                            horizon = expire
                continue
            # A store completed (_complete_store, inlined).
            queue = queue_of[key] = ~queue
            if queue:
                expire = expires[key] = now + lifetime
                if statuses[key].ref_cnt == 0:
                    queues[queue][key] = None
                    if expire < bounds[queue]:
                        bounds[queue] = expire
                        if expire < horizon:
                            horizon = expire
            elif statuses[key].ref_cnt == 0:
                first[key] = None
            now += 1
            if now > horizon:
                self._now = now
                self._demote(now)
                horizon = self._horizon
        self._now, self._horizon = now, horizon

    def mark_non_evictable(self, key: OffloadKey) -> None:
        # _dequeue, inlined: a load pins each hit block, so this runs once per hit.
        queue = self._queue.get(key)
        if queue is None or queue < 0:
            return
        order = self._queues[queue]
        if order.pop(key, 0) is None and queue and order:  # its LRU block may have changed
            self._lower_bound(queue, self._expire[next(iter(order))])

    def stats(self) -> Mapping[str, float]:
        stats: dict[str, float] = {
            f"queue{i}_evictable": len(order) for i, order in enumerate(self._queues)
        }
        stats["blocks"] = len(self._blocks)
        stats["qout_size"] = len(self._qout)
        stats["clock"] = self._now
        return stats
