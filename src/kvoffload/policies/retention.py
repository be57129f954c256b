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
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import islice

from kvoffload._checks import check_callable, check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import first_unprotected, protected_disjoint, ready_keys

MIN_PRIORITY = 0
MAX_PRIORITY = 100


def _check_priority(value: object, what: str) -> int:
    return check_int(what, value, MIN_PRIORITY, MAX_PRIORITY)


def _check_duration(value: object, req_id: str) -> float | None:
    if value is None:
        return None
    name = f"request '{req_id}': priority_duration_s"
    if value == math.inf:  # never expires
        return math.inf
    return check_number(name, value, 0, why=" (seconds; inf = for good)", or_none=True)


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
        self._clock: Callable[[], float] = check_callable(
            "clock", clock, "a callable returning seconds"
        )
        # Per stored block, in flat dicts and sets rather than one object per block: most
        # blocks only ever need a status and a level, set for a whole store in one C call.
        self._level: dict[OffloadKey, int] = {}
        self._deadline: dict[OffloadKey, tuple[float, int]] = {}  # (when, heap id); few keys
        # Evictable (per the manager's mark hooks) is listed, or user-pinned and in this set.
        self._pinned_evictable: set[OffloadKey] = set()
        # Listed (evictable, not user-pinned) blocks per level, least recent first.
        self._levels: list[OrderedDict[OffloadKey, None]] = [
            OrderedDict() for _ in range(MAX_PRIORITY + 1)
        ]
        self._nonempty = 0  # bit i set <=> self._levels[i] is not empty
        # Listed blocks whose priority expired (below the default level), in expiry order.
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

    def _known_now(self, req_context: ReqContext | None) -> float | None:
        """:meth:`_now` when it needs no clock reading (``None`` otherwise): callers read
        the clock only when a deadline needs it, and at most once per call."""
        if req_context is not None and req_context.timestamp is not None:
            return self._now(req_context)
        return self._trace_time

    def _request_priority(self, req_context: ReqContext | None) -> tuple[int, float | None]:
        """The (level, duration) a request gives its blocks; duration ``None`` = no expiry."""
        if req_context is None or req_context.priority is None:
            return self.default_priority, None
        req_id = req_context.req_id
        level = _check_priority(req_context.priority, f"request '{req_id}': priority")
        duration = _check_duration(req_context.priority_duration_s, req_id)
        if level == self.default_priority or duration is None:
            return level, None
        return level, duration

    def _set_deadline(self, key: OffloadKey, deadline: float | None) -> None:
        if deadline is None:
            self._deadline.pop(key, None)
            return
        deadline_id = self._next_deadline_id
        self._next_deadline_id += 1
        self._deadline[key] = (deadline, deadline_id)
        heapq.heappush(self._deadlines, (deadline, deadline_id, key))
        if len(self._deadlines) > 2 * len(self._blocks) + 64:
            self._compact_deadlines()

    def _compact_deadlines(self) -> None:
        current = self._deadline
        self._deadlines = [
            item
            for item in self._deadlines
            if (known := current.get(item[2])) is not None and known[1] == item[1]
        ]
        heapq.heapify(self._deadlines)

    def _expire_if_due(self, key: OffloadKey, now: float) -> bool:
        deadline = self._deadline.get(key)
        if deadline is None or deadline[0] > now:
            return False
        self._level[key] = self.default_priority
        del self._deadline[key]
        self._expirations += 1
        return True

    def _raise_priority(self, key: OffloadKey, level: int, deadline: float | None) -> None:
        current = self._level[key]
        if level > current:
            self._level[key] = level
            self._set_deadline(key, deadline)
        elif level == current:
            known = self._deadline.get(key)
            if known is not None and (deadline is None or deadline > known[0]):
                self._set_deadline(key, deadline)

    def _process_expiries(self, now: float) -> None:
        heap, current = self._deadlines, self._deadline
        while heap and heap[0][0] <= now:
            _, deadline_id, key = heapq.heappop(heap)
            known = current.get(key)
            if known is None or known[1] != deadline_id:
                continue
            listed = self._is_listed(key)
            if listed:
                self._unlist(key)
            self._expire_if_due(key, now)
            if listed:
                self._expired[key] = None
                self._listed += 1

    # ------------------------------------------------------------------ the orders
    def _is_listed(self, key: OffloadKey) -> bool:
        """Whether ``key`` (stored) is in an order: evictable and not user-pinned."""
        return key in self._levels[self._level[key]] or key in self._expired

    def _list(self, key: OffloadKey) -> None:
        """Append ``key`` at the most recent end of its level's order."""
        level = self._level[key]
        self._levels[level][key] = None
        self._nonempty |= 1 << level
        self._listed += 1

    def _unlist(self, key: OffloadKey) -> None:
        if key in self._expired:
            del self._expired[key]
        else:
            level = self._level[key]
            order = self._levels[level]
            del order[key]
            if not order:
                self._nonempty &= ~(1 << level)
        self._listed -= 1

    def _relist_as_used(self, key: OffloadKey, evictable: bool) -> None:
        """(Re-)enter an unlisted ``key`` as just used: due expiry applied, most recent."""
        if key in self._deadline:
            self._expire_if_due(key, self._now(None))
        if evictable and key not in self._user_pinned:
            self._list(key)

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

    def _forget(self, key: OffloadKey) -> None:
        """Drop an unlisted stored ``key`` from every table but the base's."""
        del self._level[key]
        self._pinned_evictable.discard(key)
        if self._deadline:
            self._deadline.pop(key, None)

    # ------------------------------------------------------------------ the contract
    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        now = self._known_now(req_context)
        level, duration = self._request_priority(req_context)
        self._level[key] = level
        if duration is not None:
            self._set_deadline(key, (self._clock() if now is None else now) + duration)
        if block.ref_cnt == 0:
            self._list(key)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        if not keys:
            return
        self._known_now(req_context)
        level, duration = self._request_priority(req_context)
        if duration is not None:  # deadlines: one insert at a time
            super().on_insert_many(keys, blocks, req_context)
            return
        self._level.update(dict.fromkeys(keys, level))
        for key in ready_keys(keys, blocks):
            self._list(key)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        if self._is_listed(key):
            self._unlist(key)
        self._forget(key)
        self._user_pinned.discard(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        now = self._known_now(req_context)
        level, duration = self._request_priority(req_context)
        walk = keys if isinstance(keys, (list, tuple)) else list(keys)
        statuses = self._blocks
        if statuses.keys().isdisjoint(walk):  # a store's misses: nothing to record
            return
        deadline = None
        if duration is not None:
            now = self._clock() if now is None else now
            deadline = now + duration
        deadlines = self._deadline
        for key in reversed(walk):
            if key not in statuses:
                continue
            listed = self._is_listed(key)
            if listed:
                self._unlist(key)
            if key in deadlines:
                now = self._clock() if now is None else now
                self._expire_if_due(key, now)
            self._raise_priority(key, level, deadline)
            if listed:
                self._list(key)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if self._deadlines:
            self._process_expiries(self._now(None))
        if n > self._listed:
            return None
        nonempty = self._nonempty
        level = (nonempty & -nonempty).bit_length() - 1
        if level >= 0 and (level < self.default_priority or not self._expired):
            order = self._levels[level]  # the lowest order: the usual source of every victim
            chosen = list(islice(order, n))
            if len(chosen) == n and (not protected or protected_disjoint(protected, chosen)):
                level_of = self._level
                for key in chosen:
                    del order[key], level_of[key]
                if not order:
                    self._nonempty = nonempty & ~(1 << level)
                self._listed -= n
                if self._deadline:
                    for key in chosen:
                        self._deadline.pop(key, None)
                return chosen
        found = first_unprotected(self._eviction_orders(), n, protected)
        if found is None:
            return None
        for key in found:
            self._unlist(key)
            self._forget(key)
        return found

    def on_clear(self) -> None:
        self._level.clear()
        self._deadline.clear()
        self._pinned_evictable.clear()
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
        if key not in self._blocks:
            return
        if self._is_listed(key):
            self._unlist(key)
        elif key in self._user_pinned:
            self._pinned_evictable.add(key)
        self._relist_as_used(key, True)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        level_of, levels, expired = self._level, self._levels, self._expired
        pinned, deadlines = self._user_pinned, self._deadline
        special = bool(pinned or deadlines or expired)
        nonempty, listed = self._nonempty, self._listed
        for key in keys:
            level = level_of.get(key)
            if level is None:
                continue  # not stored
            order = levels[level]
            if key in order or (special and (key in pinned or key in deadlines or key in expired)):
                self._nonempty, self._listed = nonempty, listed
                self.mark_evictable(key)  # re-listed, user-pinned or with a deadline
                nonempty, listed = self._nonempty, self._listed
                continue
            # The usual case (a completed store): listed at the most recent end of its level.
            order[key] = None
            nonempty |= 1 << level
            listed += 1
        self._nonempty, self._listed = nonempty, listed

    def mark_non_evictable(self, key: OffloadKey) -> None:
        if key not in self._blocks:
            return
        if key in self._user_pinned:
            self._pinned_evictable.discard(key)
        elif self._is_listed(key):
            self._unlist(key)

    # ------------------------------------------------------------------ user pins
    def pin(self, keys: Iterable[OffloadKey]) -> int:
        """Never evict ``keys`` until :meth:`unpin`; return how many are stored (pinned now).

        Keys that are not stored are ignored: a pin protects a stored block, it does not
        reserve room for a future one. Pinning is a flag, not a count.
        """
        pinned = 0
        for key in keys:
            if key not in self._blocks:
                continue
            pinned += 1
            if key in self._user_pinned:
                continue
            if self._is_listed(key):
                self._unlist(key)
                self._pinned_evictable.add(key)
            self._user_pinned.add(key)
        return pinned

    def unpin(self, keys: Iterable[OffloadKey]) -> int:
        """Undo :meth:`pin` for ``keys``; return how many were pinned. Unpinning is a use."""
        unpinned = 0
        for key in keys:
            if key not in self._user_pinned:
                continue
            self._user_pinned.remove(key)
            unpinned += 1
            evictable = key in self._pinned_evictable
            self._pinned_evictable.discard(key)
            self._relist_as_used(key, evictable)
        return unpinned

    def is_pinned(self, key: OffloadKey) -> bool:
        """Whether ``key`` is pinned by :meth:`pin`."""
        return key in self._user_pinned

    def priority(self, key: OffloadKey) -> int | None:
        """``key``'s current priority level (an expired one reads as the default), or ``None``."""
        level = self._level.get(key)
        if level is None:
            return None
        deadline = self._deadline.get(key)
        if deadline is not None and deadline[0] <= self._now(None):
            return self.default_priority
        return level

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._blocks),
            "evictable": self._listed,
            "user_pinned": len(self._user_pinned),
            "expired_waiting": len(self._expired),
            "expirations": self._expirations,
            "deadline_entries": len(self._deadlines),
        }


__all__ = ["MAX_PRIORITY", "MIN_PRIORITY", "RetentionCachePolicy"]
