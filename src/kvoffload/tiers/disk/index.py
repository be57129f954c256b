"""The disk tier's in-memory index: records by key, their arena slots, pins and byte counts.

Why it pairs the index with a block ledger: the ledger's policy (any ``CachePolicy``) decides
victims, and the ledger's pins and pending writes (the shared :class:`BlockStatus`) keep
records being read or written out of every eviction; the index adds the byte
accounting (committed plus reserved for writes in flight) a byte budget needs, and hands out
arena slots (lowest free first, so the file stays compact). Not thread-safe: the tier calls it
under its lock.

Why it tells written slots from unwritten ones: a slot past the file's end takes disk space
when it is first written, a slot the file already holds does not. A write into a fresh slot
that failed (the disk was full) leaves a slot that still takes space, so it is kept apart,
not counted as on disk (:attr:`DiskIndex.backed_slots`), and handed out only when no written
slot is free: otherwise a full disk would see room that is not there and fail every store
into that slot, where evicting a record and reusing its slot would have worked.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from kvoffload.keys import OffloadKey
from kvoffload.manager.ledger import BlockLedger
from kvoffload.policies import BlockStatus, CachePolicy
from kvoffload.policies.state import settle_restored


@dataclass(slots=True)
class IndexEntry:
    """One record: its arena slot, its size on disk and its pin state (``status.ref_cnt``)."""

    slot: int
    nbytes: int
    status: BlockStatus
    written_ns: int = 0
    doomed: bool = False  # found corrupt while pinned: drop when the last reader is done
    fresh: bool = False  # its slot was never written before (no old header to invalidate)
    backed: bool = True  # its slot is on disk already (a write into it needs no new space)


class DiskIndex:
    """Records by key, with a policy for victims, arena slots and committed/reserved bytes."""

    def __init__(self, policy: CachePolicy, max_slots: int) -> None:
        self._ledger = BlockLedger(policy, max_slots)  # one ledger slot per record
        self.max_slots = max_slots
        self._entries: dict[OffloadKey, IndexEntry] = {}
        self._free: list[int] = []  # heap of free slots below the high-water mark, on disk
        self._free_unbacked: list[int] = []  # heap of free slots no write ever reached
        self.high_water = 0  # slots [0, high_water) have been handed out at some point
        self.unbacked = 0  # of those, slots no write has reached (in flight or failed)
        self.used_bytes = 0  # records whose write completed
        self.reserved_bytes = 0  # records being written
        self.retired_bytes = 0  # slots out of use for this run (unreadable, erase failed)

    @property
    def policy(self) -> CachePolicy:
        return self._ledger.policy

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: OffloadKey) -> IndexEntry | None:
        return self._entries.get(key)

    def items(self) -> Iterator[tuple[OffloadKey, IndexEntry]]:
        return iter(list(self._entries.items()))

    # -------------------------------------------------------------- slots

    @property
    def backed_slots(self) -> int:
        """Slots the arena file holds on disk (a write into one takes no new space)."""
        return self.high_water - self.unbacked

    def retire_slot(self, nbytes: int) -> None:
        """A slot that stays out of use for this run (neither free nor a record): it still
        counts against the budget, so a full tier evicts rather than finding no slot."""
        self.retired_bytes += nbytes

    def release_slot(self, slot: int) -> None:
        """A slot whose record is gone (and, for deletes, whose header is zeroed) is free."""
        heapq.heappush(self._free, slot)

    # -------------------------------------------------------------- records

    def rebuild(
        self,
        found: list[tuple[int, OffloadKey, int]],
        slots: int,
        free: list[int],
        skipped: Collection[int],
        nbytes: int,
    ) -> list[int]:
        """Fill an empty index from a restart scan: ``found`` records as ``(written_ns, key,
        slot)``, oldest first into the policy; ``slots`` the arena's slots, ``free`` the empty
        ones, ``skipped`` the unreadable ones (kept out of use). A key found twice (a crash
        between two writes) keeps its newest record; returns the older records' slots, which
        the caller erases (they are free here already)."""
        stale: list[int] = []
        for written_ns, key, slot in sorted(found):
            if key in self._entries:
                old = self.remove_ready(key)
                if old is not None:
                    stale.append(old.slot)
                    free.append(old.slot)
            status = self._ledger.insert_ready(key)  # found ready: evictable at once
            self._entries[key] = IndexEntry(slot, nbytes, status, written_ns)
            self.used_bytes += nbytes
        self.high_water = slots  # every slot the file holds is on disk
        self._free = sorted(free)
        self.retired_bytes += len(skipped) * nbytes
        return stale

    def adopt_policy(self, restored: CachePolicy) -> None:
        """Replace the policy by ``restored`` (a saved state of it), reconciled with the index.

        Why: the scan can only seed the policy oldest record first (LRU-like); a state saved
        at the last clean close keeps its order, frequencies and ghosts. The records are the
        truth: saved blocks with no record here are removed from the policy, records it does
        not know enter it as most recent, and every entry then shares the policy's status.
        Call right after the scan (nothing pinned or being written). ``ValueError`` (nothing
        changed) if ``restored`` keeps no block table.
        """
        table = restored.block_table
        if table is None:
            raise ValueError(f"{type(restored).__name__} keeps no block_table to adopt")
        settle_restored(restored)
        for key in [key for key in table if key not in self._entries]:
            restored.remove(key)
        for key, entry in self._entries.items():
            status = table.get(key)
            if status is None:
                entry.status.ref_cnt = 0
                restored.insert(key, entry.status)
            else:
                status.ref_cnt = 0
                status.block_id = entry.status.block_id  # the ledger's slot stays the record's
                entry.status = status
        self._ledger.bind(restored)

    def make_room(
        self, nbytes: int, limit: int, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, IndexEntry]] | None:
        """Evict until ``nbytes`` more fit under ``limit``; ``None`` (nothing changed) if not.

        Every record of a tier is one slot, so all are the same size and one ``evict(n)``
        call frees exactly enough. Victims leave the index at once and their slots are free
        (a write into a slot invalidates the old header first); pinned and in-flight records
        are never among them.
        """
        deficit = self.used_bytes + self.reserved_bytes + self.retired_bytes + nbytes - limit
        if deficit <= 0:
            return []
        if nbytes > limit or not self._entries:
            return None
        unit = nbytes or next(iter(self._entries.values())).nbytes
        n = -(-deficit // unit)
        if n > len(self._entries):
            return None
        chosen = self._ledger.evict(n, protected)
        if chosen is None:
            return None
        victims = []
        for key, _status in chosen:
            entry = self._entries.pop(key)
            self.used_bytes -= entry.nbytes
            self.release_slot(entry.slot)
            victims.append((key, entry))
        return victims

    def begin_write(self, key: OffloadKey, nbytes: int) -> IndexEntry | None:
        """Reserve a slot and ``nbytes`` for a record being written (never evictable meanwhile).

        ``None`` when no slot is free (the caller's :meth:`make_room` keeps that from happening
        under a byte budget of whole slots).
        """
        entries = self.begin_writes((key,), nbytes)
        return entries[0] if entries else None

    def begin_writes(self, keys: Sequence[OffloadKey], nbytes: int) -> list[IndexEntry]:
        """:meth:`begin_write` for each of ``keys`` in order, in one ledger reservation (the
        same policy inserts as one call per key); entries for the first keys only when the
        free slots run out."""
        free_slots = len(self._free) + len(self._free_unbacked) + self.max_slots - self.high_water
        if len(keys) > free_slots:
            keys = keys[:free_slots]
        entries = []
        table = self._entries
        for key, status in zip(keys, self._ledger.reserve(keys, None), strict=True):
            # the lowest free slot on disk, else one a failed write left, else a fresh one
            # past every slot the file ever held
            if self._free:
                slot, fresh, backed = heapq.heappop(self._free), False, True
            elif self._free_unbacked:
                # not fresh: a failed write may have left a header there (fsync zeroes it)
                slot, fresh, backed = heapq.heappop(self._free_unbacked), False, False
            else:
                slot, fresh, backed = self.high_water, True, False
                self.high_water += 1
                self.unbacked += 1
            entry = IndexEntry(slot, nbytes, status, 0, False, fresh, backed)
            table[key] = entry
            entries.append(entry)
        self.reserved_bytes += nbytes * len(entries)
        return entries

    def end_write(self, key: OffloadKey, ok: bool, written_ns: int = 0) -> None:
        """A write finished: its bytes count as used (still unreadable until published)."""
        entry = self._entries[key]
        self.reserved_bytes -= entry.nbytes
        if ok:
            entry.written_ns = written_ns
            self.used_bytes += entry.nbytes
            if not entry.backed:
                entry.backed = True
                self.unbacked -= 1
        else:
            del self._entries[key]
            self._ledger.fail([key])
            if entry.backed:
                self.release_slot(entry.slot)
            else:  # still takes new space when written: reused only when no slot on disk is
                heapq.heappush(self._free_unbacked, entry.slot)

    def publish(self, keys: list[OffloadKey]) -> None:
        """Make written records readable and evictable, in the order given.

        The tier publishes a job's records together when the job ends, tail to head, so the
        policy sees the same order however the I/O threads finished.
        """
        self._ledger.complete(keys)

    def begin_read(self, key: OffloadKey) -> IndexEntry | None:
        """Pin a ready record for a read (``None`` if absent, being written or doomed)."""
        entry = self._entries.get(key)
        if entry is None or entry.status.ref_cnt < 0 or entry.doomed:
            return None
        self._ledger.pin((key,), (entry.status,))
        return entry

    def access(self, keys: list[OffloadKey]) -> None:
        """One access to each of ``keys`` (records a get job pinned), through the ledger: the
        policy learns of reads the same way the CPU tier's does."""
        self._ledger.access(None, keys, None)

    def end_read(self, key: OffloadKey, corrupt: bool) -> IndexEntry | None:
        """Unpin; returns the entry when it must now be erased (found corrupt, last reader).

        The erased entry's slot is *not* free yet: the caller zeroes its header, then
        calls :meth:`release_slot`.
        """
        entry = self._entries[key]
        if corrupt:
            entry.doomed = True
        if not entry.doomed:
            self._ledger.unpin((key,))
            return None
        if not self._ledger.drop_pin(key):
            return None
        del self._entries[key]
        self.used_bytes -= entry.nbytes
        return entry

    def remove_ready(self, key: OffloadKey) -> IndexEntry | None:
        """Drop an unpinned record (a delete); ``None`` if it is pinned or being written.

        As with :meth:`end_read`, the slot is released by the caller once its header is zeroed.
        """
        entry = self._entries.get(key)
        if entry is None or not self._ledger.remove_ready(key):
            return None
        del self._entries[key]
        self.used_bytes -= entry.nbytes
        return entry


__all__ = ["DiskIndex", "IndexEntry"]
