"""The policy contract: :class:`BlockStatus` and the :class:`CachePolicy` ABC.

The shape is vLLM's (``get / insert / remove / touch / evict / clear / mark_evictable /
mark_non_evictable``) so policies port both ways. The policy owns the key -> status table and
the replacement order; the manager owns the pin counts, mutating ``ref_cnt`` on the shared
status objects and calling the mark hooks on every transition to and from 0.

Driving protocol (what the manager calls, in this order; ``kvoffload.testing`` drives policies
the same way, and libCacheSim equivalence is defined under it):

* **hit** on key ``k`` (once per request and key): ``touch([k], ctx)``; a load pins it:
  ``ref_cnt`` 0 -> 1 calls ``mark_non_evictable(k)``, the last unpin calls ``mark_evictable(k)``.
* **miss** on key ``k`` that is being stored: ``touch([k], ctx)`` first (ghost learning, e.g.
  ARC adapts its target on a ghost hit), then, if there is no free slot,
  ``evict(n, protected)`` where ``protected`` holds every key offered in that store (so the
  policy can see the missed keys), then ``insert(k, BlockStatus(slot), ctx)`` with
  ``ref_cnt == -1`` (being written). Completion sets ``ref_cnt = 0`` and calls
  ``mark_evictable(k)``; a failed write calls ``remove(k)`` instead.
* The manager may batch these: ``insert_many`` / ``mark_evictable_many`` must behave like the
  same single calls in order (the defaults do exactly that; overrides only go faster).
* A victim's status object (and a removed block's) belongs to the manager again: it may be
  reused for the next block stored in that slot, so a policy must not keep references to it.
* Within one call the manager walks keys so that the request's head ends up most recent
  (``touch`` walks ``keys`` tail to head; completions mark tail to head): tails go first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import ClassVar

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey


class BlockStatus:
    """A stored block's slot and pin count, shared by the manager and the policy.

    ``ref_cnt``: -1 = being written (not readable, never evictable); 0 = ready and evictable;
    > 0 = ready and being read by that many loads (never evictable). ``block_id`` is the slot.
    """

    __slots__ = ("block_id", "ref_cnt")

    def __init__(self, block_id: int, ref_cnt: int = -1) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt

    @property
    def is_ready(self) -> bool:
        """True once the block's write completed (it can be read)."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"BlockStatus(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


Victims = list[tuple[OffloadKey, BlockStatus]]


class CachePolicy(ABC):
    """Owns the stored blocks' table and decides which ones to evict.

    Subclasses take their tunables as keyword arguments after ``cache_capacity`` (the manager
    passes ``cache_policy_params`` through) and validate them with clear ``ValueError``\\ s.
    """

    #: Short registry name, set on built-ins (informational; the registry is authoritative).
    name: ClassVar[str] = ""

    #: Whether ``touch`` on keys that are not stored means anything to this policy (ghost
    #: learning). A policy that ignores them sets it to ``False``, and a manager may then skip
    #: touching a store's keys when none of them is stored.
    touches_misses: ClassVar[bool] = True

    def __init__(self, cache_capacity: int) -> None:
        if isinstance(cache_capacity, bool) or not isinstance(cache_capacity, int):
            raise TypeError(f"cache_capacity must be an int, got {type(cache_capacity).__name__}")
        if cache_capacity < 0:
            raise ValueError(f"cache_capacity must be >= 0, got {cache_capacity}")
        self.cache_capacity = cache_capacity

    @abstractmethod
    def get(self, key: OffloadKey) -> BlockStatus | None:
        """Return ``key``'s status, or ``None`` if it is not stored.

        Pure: no recency, frequency, ghost or any other state may change.
        """

    @abstractmethod
    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        """Add a block that is not stored yet (normally ``ref_cnt == -1``: being written).

        A block inserted with ``ref_cnt == 0`` is evictable at once.
        """

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` entirely (a failed store). No ghost entry, no trace; absent = no-op."""

    @abstractmethod
    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Record one access to each of ``keys`` (in prefix order, head first).

        Called once per request and key. Keys that are not stored may be ghost hits; keys
        that are not stored and unknown are ignored.
        """

    @abstractmethod
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        """Choose and remove exactly ``n`` victims, or return ``None`` and change nothing.

        Every victim is stored, ready and unpinned (``ref_cnt == 0``) and not in
        ``protected``. On success the victims are no longer stored (``get`` returns ``None``)
        and are returned as ``(key, status)`` pairs. On failure nothing at all changes: not
        the order, not ghost lists, not adaptive targets, not random state. ``n == 0``
        returns ``[]``.
        """

    @abstractmethod
    def clear(self) -> None:
        """Drop every block regardless of pins, and all history: as good as new."""

    def insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        """``insert`` each key with its block, in order (override to batch the work)."""
        for key, block in zip(keys, blocks, strict=True):
            self.insert(key, block, req_context)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """``mark_evictable`` each key, in order (override to batch the work)."""
        for key in keys:
            self.mark_evictable(key)

    def mark_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """Hook: ``key``'s ``ref_cnt`` just became 0 (store completed, last load done)."""

    def mark_non_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """Hook: ``key``'s ``ref_cnt`` just left 0 (first concurrent load started)."""

    def on_request_finished(self, req_context: ReqContext) -> None:  # noqa: B027 - optional hook
        """Hook: the request will make no more store or load calls (completions may follow)."""

    @property
    def block_table(self) -> Mapping[OffloadKey, BlockStatus] | None:
        """Read-only view of every stored block, if the policy keeps one dict of them.

        Optional: when it is not ``None`` the manager reads statuses from it directly
        (a C-level lookup) instead of calling :meth:`get`. It must always agree with ``get``.
        """
        return None

    def stats(self) -> Mapping[str, float]:
        """Policy-specific gauges (e.g. ARC's target and ghost sizes); empty by default."""
        return {}


__all__ = ["BlockStatus", "CachePolicy", "Victims"]
