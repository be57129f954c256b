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
from collections.abc import Collection, Iterable, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims


class _Entry:
    """A resident block's MQ bookkeeping."""

    __slots__ = ("expire", "freq", "queue", "status", "written")

    def __init__(self, status: BlockStatus, freq: int, queue: int) -> None:
        self.status = status
        self.freq = freq
        self.queue = queue
        self.expire = 0
        self.written = False  # the store's insertion is counted when its write completes


def _check_int(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


class MQCachePolicy(CachePolicy):
    """Multi-Queue (ATC'01): LRU queues by access count, with lifetime-based demotion."""

    name = "mq"

    def __init__(
        self,
        cache_capacity: int,
        *,
        num_queues: int = 8,
        lifetime: int = 10000,
        qout_ratio: float = 4.0,
    ) -> None:
        super().__init__(cache_capacity)
        self.num_queues = _check_int("num_queues", num_queues, 1, 64)
        self.lifetime = _check_int("lifetime", lifetime, 1, 2**62)
        if isinstance(qout_ratio, bool) or not isinstance(qout_ratio, (int, float)):
            raise TypeError(f"qout_ratio must be a number, got {type(qout_ratio).__name__}")
        if not 0.0 <= qout_ratio <= 64.0:
            raise ValueError(f"qout_ratio must be in [0, 64] (ghosts per block), got {qout_ratio}")
        self.qout_ratio = float(qout_ratio)
        self._qout_limit = int(cache_capacity * self.qout_ratio)
        self._entries: dict[OffloadKey, _Entry] = {}
        # Evictable blocks per queue, LRU first.
        self._queues: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(num_queues)
        ]
        self._qout: OrderedDict[OffloadKey, int] = OrderedDict()  # ghost -> count, oldest first
        self._revived: OrderedDict[OffloadKey, int] = OrderedDict()  # Qout hits awaiting insert
        self._now = 0

    def _queue_for(self, freq: int) -> int:
        return min(freq.bit_length() - 1, self.num_queues - 1)

    def get(self, key: OffloadKey) -> BlockStatus | None:
        entry = self._entries.get(key)
        return entry.status if entry is not None else None

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        past = self._revived.pop(key, None)
        ghost = self._qout.pop(key, None)  # inserted without a touch: still a Qout hit
        freq = (past if past is not None else ghost if ghost is not None else 0) + 1
        entry = _Entry(block, freq, self._queue_for(freq))
        self._entries[key] = entry
        if block.ref_cnt >= 0:  # inserted ready: the store is complete now
            self._complete_store(key, entry)

    def _complete_store(self, key: OffloadKey, entry: _Entry) -> None:
        """The insertion "access": queue the block, start its lifetime, advance the clock."""
        entry.written = True
        if entry.status.ref_cnt == 0:
            self._queues[entry.queue][key] = None
        entry.expire = self._now + self.lifetime
        self._tick()

    def remove(self, key: OffloadKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._queues[entry.queue].pop(key, None)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        entries = self._entries
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            entry = entries.get(key)
            if entry is None:
                freq = self._qout.pop(key, None)
                if freq is not None:
                    self._revived[key] = freq
                    if len(self._revived) > max(1, self.cache_capacity):
                        self._revived.popitem(last=False)
                continue
            entry.freq += 1
            queue = self._queue_for(entry.freq)
            if self._queues[entry.queue].pop(key, 0) is None:
                self._queues[queue][key] = None
            entry.queue = queue
            entry.expire = self._now + self.lifetime
            self._tick()

    def _tick(self) -> None:
        """Advance the clock; demote each queue's LRU block whose lifetime has run out."""
        self._now += 1
        now = self._now
        queues = self._queues
        for k in range(1, self.num_queues):
            order = queues[k]
            if not order:
                continue
            key = next(iter(order))
            entry = self._entries[key]
            if entry.expire < now:
                del order[key]
                queues[k - 1][key] = None
                entry.queue = k - 1
                entry.expire = now + self.lifetime

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        chosen: list[OffloadKey] = []
        for order in self._queues:
            for key in order:
                if key not in protected:
                    chosen.append(key)
                    if len(chosen) == n:
                        break
            if len(chosen) == n:
                break
        else:
            return None
        victims: Victims = []
        for key in chosen:
            entry = self._entries.pop(key)
            del self._queues[entry.queue][key]
            victims.append((key, entry.status))
            if self._qout_limit > 0:
                self._qout[key] = entry.freq
                if len(self._qout) > self._qout_limit:
                    self._qout.popitem(last=False)
        return victims

    def clear(self) -> None:
        self._entries.clear()
        for order in self._queues:
            order.clear()
        self._qout.clear()
        self._revived.clear()
        self._now = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        entry = self._entries.get(key)
        if entry is not None and not entry.written:
            self._complete_store(key, entry)
        elif entry is not None:
            order = self._queues[entry.queue]
            order[key] = None
            order.move_to_end(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            self._queues[entry.queue].pop(key, None)

    def stats(self) -> Mapping[str, float]:
        stats: dict[str, float] = {
            f"queue{i}_evictable": len(order) for i, order in enumerate(self._queues)
        }
        stats["blocks"] = len(self._entries)
        stats["qout_size"] = len(self._qout)
        stats["clock"] = self._now
        return stats
