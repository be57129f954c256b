"""Retention priorities in the style of TensorRT-LLM's KV-cache retention config.

A request may say how much its blocks are worth keeping: ``ReqContext.priority`` (0..100,
higher = evicted later) for ``ReqContext.priority_duration_s`` seconds, after which the block
falls back to the default priority (``None`` = for good). Eviction takes the lowest priority
level first and is LRU within a level. Rules:

* A block gets its priority when it is stored or used. A block shared by several requests
  keeps the highest unexpired priority any of them gave it (a later lower-priority request
  cannot demote a block someone else raised); an equal priority extends the expiry.
* A block whose priority expired joins the default level *below* the blocks used at the
  default level, in expiry order: its priority ran out, and its last use is at least that
  long ago. Using it again makes it an ordinary default-level block.
* ``pin(keys)`` / ``unpin(keys)`` are an explicit user pin, apart from the manager's
  ``ref_cnt``: a user-pinned block is never evicted (``evict`` may then return ``None`` though
  the manager counts the block as evictable); ``stats()["user_pinned"]`` counts them.

Time is the request's ``ReqContext.timestamp`` (seconds; trace time in the simulator) when
given, else ``clock()`` (``time.monotonic`` by default). Once a timestamp has been seen, the
policy keeps the latest one as "now" for calls without one, so trace time never mixes with
the wall clock. Expiry is lazy: deadlines sit in a heap processed at eviction, and a block that
is used, pinned or unpinned is checked on its own, so the outcome never depends on when the
heap was processed. Every operation is O(1) amortised plus O(log n) per deadline; eviction
scans at most the 101 levels' heads, never the pinned blocks.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy, Victims

MIN_PRIORITY = 0
MAX_PRIORITY = 100


def _check_priority(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{what} must be an int in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {value!r}"
        )
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{what} must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {value}")
    return value


def _check_duration(value: object, req_id: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(
            f"request '{req_id}': priority_duration_s must be a number of seconds or None, "
            f"got {value!r}"
        )
    if value < 0:
        raise ValueError(f"request '{req_id}': priority_duration_s must be >= 0, got {value}")
    return float(value)


class _Entry:
    """A stored block: its status, priority level, deadline and whether it can be evicted."""

    __slots__ = ("deadline", "deadline_id", "evictable", "expired", "level", "status")

    def __init__(self, status: BlockStatus, level: int) -> None:
        self.status = status
        self.level = level
        self.deadline: float | None = None  # when ``level`` falls back to the default
        self.deadline_id = -1  # which heap entry is current
        self.evictable = status.ref_cnt == 0  # per the manager's mark hooks
        self.expired = False  # listed in the expired order (below the default level)


class RetentionCachePolicy(CachePolicy):
    """Retention priorities (TensorRT-LLM style): low priority first, LRU within a level."""

    name = "retention"

    def __init__(
        self,
        cache_capacity: int,
        *,
        default_priority: int = 35,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cache_capacity)
        self.default_priority = _check_priority(default_priority, "default_priority")
        if not callable(clock):
            raise ValueError(f"clock must be a callable returning seconds, got {clock!r}")
        self._clock = clock
        self._entries: dict[OffloadKey, _Entry] = {}
        # Listed (evictable, not user-pinned) blocks per level, least recent first.
        self._levels: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(MAX_PRIORITY + 1)
        ]
        self._nonempty = 0  # bit i set <=> self._levels[i] is not empty
        self._expired: OrderedDict[OffloadKey, None] = OrderedDict()
        self._listed = 0
        self._deadlines: list[tuple[float, int, OffloadKey]] = []  # lazy min-heap
        self._next_deadline_id = 0
        self._user_pinned: set[OffloadKey] = set()
        self._trace_time: float | None = None
        self._expirations = 0

    # ------------------------------------------------------------------ time and priority
    def _now(self, req_context: ReqContext | None) -> float:
        stamp = req_context.timestamp if req_context is not None else None
        if stamp is not None:
            if self._trace_time is None or stamp > self._trace_time:
                self._trace_time = float(stamp)
            return self._trace_time
        if self._trace_time is not None:
            return self._trace_time
        return self._clock()

    def _request_priority(
        self, req_context: ReqContext | None, now: float
    ) -> tuple[int, float | None]:
        """The (level, deadline) a request gives its blocks; deadline ``None`` = no expiry."""
        if req_context is None or req_context.priority is None:
            return self.default_priority, None
        req_id = req_context.req_id
        level = _check_priority(req_context.priority, f"request '{req_id}': priority")
        duration = _check_duration(req_context.priority_duration_s, req_id)
        if level == self.default_priority or duration is None:
            return level, None
        return level, now + duration

    def _set_deadline(self, key: OffloadKey, entry: _Entry, deadline: float | None) -> None:
        entry.deadline = deadline
        if deadline is None:
            entry.deadline_id = -1
            return
        entry.deadline_id = self._next_deadline_id
        self._next_deadline_id += 1
        heapq.heappush(self._deadlines, (deadline, entry.deadline_id, key))
        if len(self._deadlines) > 2 * len(self._entries) + 64:
            self._compact_deadlines()

    def _compact_deadlines(self) -> None:
        entries = self._entries
        self._deadlines = [
            item
            for item in self._deadlines
            if (entry := entries.get(item[2])) is not None and entry.deadline_id == item[1]
        ]
        heapq.heapify(self._deadlines)

    def _expire_if_due(self, entry: _Entry, now: float) -> bool:
        if entry.deadline is None or entry.deadline > now:
            return False
        entry.level = self.default_priority
        entry.deadline = None
        entry.deadline_id = -1
        self._expirations += 1
        return True

    def _raise_priority(
        self, key: OffloadKey, entry: _Entry, level: int, deadline: float | None
    ) -> None:
        if level > entry.level:
            entry.level = level
            self._set_deadline(key, entry, deadline)
        elif level == entry.level and entry.deadline is not None:
            if deadline is None:
                self._set_deadline(key, entry, None)
            elif deadline > entry.deadline:
                self._set_deadline(key, entry, deadline)

    def _process_expiries(self, now: float) -> None:
        heap, entries = self._deadlines, self._entries
        while heap and heap[0][0] <= now:
            _, deadline_id, key = heapq.heappop(heap)
            entry = entries.get(key)
            if entry is None or entry.deadline_id != deadline_id:
                continue
            listed = self._is_listed(key, entry)
            if listed:
                self._unlist(key, entry)
            self._expire_if_due(entry, now)
            if listed:
                entry.expired = True
                self._list(key, entry)

    # ------------------------------------------------------------------ the orders
    def _is_listed(self, key: OffloadKey, entry: _Entry) -> bool:
        return entry.evictable and key not in self._user_pinned

    def _list(self, key: OffloadKey, entry: _Entry) -> None:
        """Append ``key`` at the most recent end of its order."""
        if entry.expired:
            self._expired[key] = None
        else:
            self._levels[entry.level][key] = None
            self._nonempty |= 1 << entry.level
        self._listed += 1

    def _unlist(self, key: OffloadKey, entry: _Entry) -> None:
        if entry.expired:
            del self._expired[key]
        else:
            order = self._levels[entry.level]
            del order[key]
            if not order:
                self._nonempty &= ~(1 << entry.level)
        self._listed -= 1

    def _relist_as_used(self, key: OffloadKey, entry: _Entry, now: float) -> None:
        """(Re-)enter an unlisted ``key`` as just used: due expiry applied, most recent."""
        self._expire_if_due(entry, now)
        entry.expired = False
        if self._is_listed(key, entry):
            self._list(key, entry)

    def _eviction_orders(self) -> Iterator[OrderedDict[OffloadKey, None]]:
        """Orders in eviction sequence: levels ascending, expired blocks just below default."""
        expired_first = bool(self._expired)
        default = self.default_priority
        levels = self._nonempty
        while levels:
            lowest = levels & -levels
            level = lowest.bit_length() - 1
            if expired_first and level >= default:
                expired_first = False
                yield self._expired
            yield self._levels[level]
            levels ^= lowest
        if expired_first:
            yield self._expired

    # ------------------------------------------------------------------ the contract
    def get(self, key: OffloadKey) -> BlockStatus | None:
        entry = self._entries.get(key)
        return entry.status if entry is not None else None

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        if key in self._entries:
            self.remove(key)
        now = self._now(req_context)
        level, deadline = self._request_priority(req_context, now)
        entry = self._entries[key] = _Entry(block, level)
        self._set_deadline(key, entry, deadline)
        if self._is_listed(key, entry):
            self._list(key, entry)

    def remove(self, key: OffloadKey) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        if self._is_listed(key, entry):
            self._unlist(key, entry)
        del self._entries[key]
        self._user_pinned.discard(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        now = self._now(req_context)
        level, deadline = self._request_priority(req_context, now)
        entries = self._entries
        for key in reversed(keys if isinstance(keys, (list, tuple)) else list(keys)):
            entry = entries.get(key)
            if entry is None:
                continue
            listed = self._is_listed(key, entry)
            if listed:
                self._unlist(key, entry)
            self._expire_if_due(entry, now)
            self._raise_priority(key, entry, level, deadline)
            entry.expired = False
            if listed:
                self._list(key, entry)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        self._process_expiries(self._now(None))
        if n > self._listed:
            return None
        chosen: list[OffloadKey] = []
        for order in self._eviction_orders():
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
        entries = self._entries
        for key in chosen:
            entry = entries.pop(key)
            self._unlist(key, entry)
            victims.append((key, entry.status))
        return victims

    def clear(self) -> None:
        self._entries.clear()
        for order in self._levels:
            order.clear()
        self._nonempty = 0
        self._expired.clear()
        self._listed = 0
        self._deadlines.clear()
        self._user_pinned.clear()
        self._trace_time = None
        self._expirations = 0

    def mark_evictable(self, key: OffloadKey) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        if self._is_listed(key, entry):
            self._unlist(key, entry)
        entry.evictable = True
        self._relist_as_used(key, entry, self._now(None))

    def mark_non_evictable(self, key: OffloadKey) -> None:
        entry = self._entries.get(key)
        if entry is None or not entry.evictable:
            return
        if self._is_listed(key, entry):
            self._unlist(key, entry)
        entry.evictable = False
        entry.expired = False

    # ------------------------------------------------------------------ user pins
    def pin(self, keys: Iterable[OffloadKey]) -> int:
        """Never evict ``keys`` until :meth:`unpin`; return how many are stored (pinned now).

        Keys that are not stored are ignored: a pin protects a stored block, it does not
        reserve room for a future one. Pinning is a flag, not a count.
        """
        pinned = 0
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                continue
            pinned += 1
            if key in self._user_pinned:
                continue
            if self._is_listed(key, entry):
                self._unlist(key, entry)
            entry.expired = False
            self._user_pinned.add(key)
        return pinned

    def unpin(self, keys: Iterable[OffloadKey]) -> int:
        """Undo :meth:`pin` for ``keys``; return how many were pinned. Unpinning is a use."""
        unpinned = 0
        now: float | None = None
        for key in keys:
            if key not in self._user_pinned:
                continue
            self._user_pinned.remove(key)
            unpinned += 1
            if now is None:
                now = self._now(None)
            self._relist_as_used(key, self._entries[key], now)
        return unpinned

    def is_pinned(self, key: OffloadKey) -> bool:
        """Whether ``key`` is pinned by :meth:`pin`."""
        return key in self._user_pinned

    def priority(self, key: OffloadKey) -> int | None:
        """``key``'s current priority level (an expired one reads as the default), or ``None``."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.deadline is not None and entry.deadline <= self._now(None):
            return self.default_priority
        return entry.level

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._entries),
            "evictable": self._listed,
            "user_pinned": len(self._user_pinned),
            "expired_waiting": len(self._expired),
            "expirations": self._expirations,
            "deadline_entries": len(self._deadlines),
        }


__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "RetentionCachePolicy"]
