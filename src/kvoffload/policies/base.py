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

from kvoffload._checks import check_int
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


def already_stored(key: OffloadKey) -> ValueError:
    """The one error for inserting a key that is stored (or given twice in one batch)."""
    return ValueError(f"insert: key {key!r} is already stored (or given twice); remove it first")


#: (single call, batched call, base loop): a subclass that overrides the single call but not
#: the batched one gets the base's loop over its single call as the batched call (see
#: :meth:`CachePolicy.__init_subclass__`).
_BATCHED_BY_SINGLE = (
    ("insert", "insert_many", "_insert_each"),
    ("on_insert", "on_insert_many", "on_insert_many"),
    ("mark_evictable", "mark_evictable_many", "mark_evictable_many"),
)


class CachePolicy(ABC):
    """Owns the stored blocks' table and decides which ones to evict.

    The table is the base's: ``self._blocks`` (key -> status, every stored block, pending and
    pinned included). The base makes every write to it: :meth:`insert` / :meth:`insert_many`
    add (and refuse a key that is stored), :meth:`evict` / :meth:`remove` / :meth:`clear`
    drop; :meth:`get`, :attr:`block_table`, ``len()`` and ``in`` read it, so every policy gets
    the manager's direct-lookup fast path. A subclass keeps only its replacement order, in
    the hooks: :meth:`on_insert` (and :meth:`on_insert_many`), :meth:`evict_keys`,
    :meth:`on_remove`, :meth:`on_clear`, plus ``touch`` and the mark hooks. A subclass may
    still override ``insert`` / ``evict`` / ``remove`` / ``clear`` whole (then it writes
    ``self._blocks`` itself, as the contract before the hooks asked).

    Subclasses take their tunables as keyword arguments after ``cache_capacity`` (the manager
    passes ``cache_policy_params`` through) and check them with :mod:`kvoffload._checks`
    (``TypeError`` for a wrong type, ``ValueError`` for a wrong value).

    Inserting a key that is already stored is a caller's bug: it raises ``ValueError`` (see
    :meth:`_require_absent`) before anything changes.
    """

    #: Short registry name, set on built-ins (informational; the registry is authoritative).
    name: ClassVar[str] = ""

    #: Whether ``touch`` on keys that are not stored means anything to this policy (ghost
    #: learning). A policy that ignores them sets it to ``False``, and a manager may then skip
    #: touching a store's keys when none of them is stored. A subclass that overrides ``touch``
    #: without setting it again gets ``True`` (its ``touch`` may learn from misses).
    touches_misses: ClassVar[bool] = True

    #: Parameters this policy counts in accesses (or inserts), by attribute name: a miniature
    #: of it on a sample of ``rate`` of the keys (``kvoffload.selection.shadow``) sees ``rate``
    #: times the accesses, so it gets them scaled by ``rate`` as its capacity is, or its
    #: clocks would run ``1 / rate`` times slow and it would decide like a bigger cache.
    access_count_params: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        """The one batching rule: a batched call always honours the class's single calls.

        A class that overrides ``insert``, ``on_insert`` or ``mark_evictable`` but not its
        batched twin (``insert_many``, ``on_insert_many``, ``mark_evictable_many``) gets the
        base loop over its single call back, so an ancestor's batched fast path never skips
        the subclass's hook. One that overrides ``evict`` whole needs no :meth:`evict_keys` (an
        inherited one stays, for its ``super().evict``).
        One that overrides ``touch`` but not ``touches_misses`` gets ``touches_misses =
        True``; one that overrides ``get`` but not ``block_table`` gets no table view (the
        manager then calls its ``get``).
        """
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        base = vars(CachePolicy)
        for single, batched, loop in _BATCHED_BY_SINGLE:
            if single in own and batched not in own:
                setattr(cls, batched, base[loop])
        if "evict" in own and getattr(cls.evict_keys, "__isabstractmethod__", False):
            cls.evict_keys = base["_evict_keys_unused"]  # type: ignore[method-assign]
        if "touch" in own and "touches_misses" not in own:
            cls.touches_misses = True
        if "get" in own and "block_table" not in own:
            cls.block_table = base["_no_table"]  # type: ignore[method-assign]

    def __init__(self, cache_capacity: int) -> None:
        self.cache_capacity = check_int("cache_capacity", cache_capacity, 0)
        #: Every stored block (see the class docstring); only the base writes it.
        self._blocks: dict[OffloadKey, BlockStatus] = {}

    def get(self, key: OffloadKey) -> BlockStatus | None:
        """Return ``key``'s status, or ``None`` if it is not stored.

        Pure: no recency, frequency, ghost or any other state may change.
        """
        return self._blocks.get(key)

    @property
    def block_table(self) -> Mapping[OffloadKey, BlockStatus] | None:
        """Read-only view of every stored block (the base's table).

        When it is not ``None`` the manager reads statuses from it directly (a C-level
        lookup) instead of calling :meth:`get`; it always agrees with ``get``.
        """
        return self._blocks

    @property
    def _no_table(self) -> Mapping[OffloadKey, BlockStatus] | None:
        """``block_table`` of a class that keeps its own ``get``: no view, use ``get``."""
        return None

    def __len__(self) -> int:
        """The number of stored blocks."""
        return len(self._blocks)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is stored (pure, like :meth:`get`)."""
        return key in self._blocks

    def _require_absent(self, keys: Sequence[OffloadKey]) -> None:
        """Raise ``ValueError`` if any of ``keys`` is stored or given twice (nothing changes).

        The one double-insert error: inserting a stored key would leave two slots for one
        key (the manager's slot count and the policy's disagree) and corrupt the policy's
        segment sizes, so every built-in refuses it the same way.
        """
        blocks = self._blocks
        if len(keys) == 1:
            if keys[0] in blocks:
                raise already_stored(keys[0])
            return
        if not blocks.keys().isdisjoint(keys) or len(set(keys)) < len(keys):
            seen: set[OffloadKey] = set()
            for key in keys:
                if key in blocks or key in seen:
                    raise already_stored(key)
                seen.add(key)

    def _add_blocks(self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> None:
        """Add ``keys`` to the table in one update, for a batched ``insert_many``.

        The same double-insert rule as :meth:`_require_absent` (``ValueError``, nothing
        changed) for about a third of its cost: one ``isdisjoint`` against the table, and a
        repeated key found by the table growing less than the batch (then undone). Unequal
        lengths are a ``ValueError`` before anything changes, too.
        """
        if len(keys) != len(blocks):
            raise ValueError(f"insert_many: {len(keys)} keys but {len(blocks)} blocks")
        table = self._blocks
        if not table.keys().isdisjoint(keys):
            self._require_absent(keys)  # raises: one of them is stored
        before = len(table)
        table.update(zip(keys, blocks, strict=True))
        if len(table) - before != len(keys):  # a key given twice: nothing may change
            for key in keys:
                table.pop(key, None)
            self._require_absent(keys)  # raises for the repeated key

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        """Add a block that is not stored yet (normally ``ref_cnt == -1``: being written).

        A block inserted with ``ref_cnt == 0`` is evictable at once. A key that is already
        stored raises ``ValueError`` and changes nothing. The base adds it to the table, then
        calls :meth:`on_insert`.
        """
        blocks = self._blocks
        if key in blocks:
            raise already_stored(key)
        blocks[key] = block
        self.on_insert(key, block, req_context)

    def insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        """``insert`` each key with its block, in order: one table update, then
        :meth:`on_insert_many`.

        A key already stored, or given twice, or unequal lengths raise ``ValueError`` before
        anything changes.
        """
        self._add_blocks(keys, blocks)
        self.on_insert_many(keys, blocks, req_context)

    def _insert_each(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None = None,
    ) -> None:
        """``insert_many`` of a class that overrides ``insert`` alone: its ``insert`` per key
        (the same errors as :meth:`insert_many`, before any insert)."""
        if len(keys) != len(blocks):
            raise ValueError(f"insert_many: {len(keys)} keys but {len(blocks)} blocks")
        self._require_absent(keys)
        insert = self.insert
        for key, block in zip(keys, blocks, strict=True):
            insert(key, block, req_context)

    def on_insert(  # noqa: B027 - optional hook
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        """Hook: ``key`` was just added to the table (order it; ``ref_cnt == 0``: evictable)."""

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        """Hook: ``keys`` were just added to the table, in one update; :meth:`on_insert` each,
        in order (override to batch the work: it must decide exactly like the single calls)."""
        on_insert = self.on_insert
        for key, block in zip(keys, blocks, strict=True):
            on_insert(key, block, req_context)

    def remove(self, key: OffloadKey) -> None:
        """Forget ``key`` entirely (a failed store). No ghost entry, no trace; absent = no-op.

        The base drops it from the table, then calls :meth:`on_remove`.
        """
        block = self._blocks.pop(key, None)
        if block is not None:
            self.on_remove(key, block)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:  # noqa: B027 - optional hook
        """Hook: ``key`` (stored as ``block``) left the table by :meth:`remove`: forget it,
        leaving no ghost or other trace."""

    @abstractmethod
    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        """Record one access to each of ``keys`` (in prefix order, head first).

        Called once per request and key. Keys that are not stored may be ghost hits; keys
        that are not stored and unknown are ignored.
        """

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        """Choose and remove exactly ``n`` victims, or return ``None`` and change nothing.

        Every victim is stored, ready and unpinned (``ref_cnt == 0``) and not in
        ``protected``. On success the victims are no longer stored (``get`` returns ``None``)
        and are returned as ``(key, status)`` pairs. On failure nothing at all changes: not
        the order, not ghost lists, not adaptive targets, not random state. ``n == 0``
        returns ``[]``. The base asks :meth:`evict_keys` and drops its keys from the table.
        """
        if n <= 0:
            return []
        chosen = self.evict_keys(n, protected)
        if chosen is None:
            return None
        return list(zip(chosen, map(self._blocks.pop, chosen), strict=True))

    @abstractmethod
    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        """Choose exactly ``n >= 1`` victims and drop them from the order (the base then drops
        them from the table, so they are still in it here), or return ``None`` having changed
        nothing. The rules of :meth:`evict` hold for the keys chosen."""

    def _evict_keys_unused(
        self, n: int, protected: Collection[OffloadKey]
    ) -> list[OffloadKey] | None:
        """``evict_keys`` of a class that overrides ``evict`` whole: never called by the base."""
        raise NotImplementedError(f"{type(self).__name__} overrides evict, not evict_keys")

    def clear(self) -> None:
        """Drop every block regardless of pins, and all history: as good as new.

        The base empties the table, then calls :meth:`on_clear`.
        """
        self._blocks.clear()
        self.on_clear()

    def on_clear(self) -> None:  # noqa: B027 - optional hook
        """Hook: the table was emptied; forget the order and all history."""

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        """``mark_evictable`` each key, in order (override to batch the work)."""
        mark_evictable = self.mark_evictable
        for key in keys:
            mark_evictable(key)

    def mark_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """Hook: ``key``'s ``ref_cnt`` just became 0 (store completed, last load done)."""

    def mark_non_evictable(self, key: OffloadKey) -> None:  # noqa: B027 - optional hook
        """Hook: ``key``'s ``ref_cnt`` just left 0 (first concurrent load started)."""

    def on_request_finished(self, req_context: ReqContext) -> None:  # noqa: B027 - optional hook
        """Hook: the request will make no more store or load calls (completions may follow)."""

    def stats(self) -> Mapping[str, float]:
        """Policy-specific gauges (e.g. ARC's target and ghost sizes); empty by default."""
        return {}


__all__ = ["BlockStatus", "CachePolicy", "Victims", "already_stored"]
