"""The disk tier's in-memory index: which records exist, their pins, bytes and eviction order.

Why it pairs the index with a registry policy: the policy (any ``CachePolicy``) decides victims,
and the pin count on the shared :class:`BlockStatus` is what keeps records being read
(``ref_cnt > 0``) or written (``ref_cnt == -1``) out of every eviction; the index adds the byte
accounting (committed plus reserved for writes in flight) that a byte budget needs. Not
thread-safe: the tier calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from kvoffload.keys import OffloadKey
from kvoffload.policies import BlockStatus, CachePolicy


@dataclass
class IndexEntry:
    """One record: its file, its size on disk and its pin state (``status.ref_cnt``)."""

    path: str
    nbytes: int
    status: BlockStatus
    mtime: float = 0.0
    doomed: bool = False  # found corrupt while pinned: delete when the last reader is done


class DiskIndex:
    """Records by key, with a policy for victims and committed/reserved byte counts."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self._entries: dict[OffloadKey, IndexEntry] = {}
        self.used_bytes = 0  # records whose write completed
        self.reserved_bytes = 0  # records being written
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: OffloadKey) -> IndexEntry | None:
        return self._entries.get(key)

    def items(self) -> Iterator[tuple[OffloadKey, IndexEntry]]:
        return iter(list(self._entries.items()))

    def _status(self, ref_cnt: int) -> BlockStatus:
        self._next_id += 1
        return BlockStatus(self._next_id, ref_cnt)

    def add_ready(self, key: OffloadKey, path: str, nbytes: int, mtime: float) -> None:
        """A record found on disk (restart scan), evictable at once."""
        entry = IndexEntry(path, nbytes, self._status(0), mtime)
        self._entries[key] = entry
        self.used_bytes += nbytes
        self.policy.insert(key, entry.status)

    def make_room(
        self, nbytes: int, limit: int, protected: Collection[OffloadKey]
    ) -> list[tuple[OffloadKey, IndexEntry]] | None:
        """Evict until ``nbytes`` more fit under ``limit``; ``None`` (nothing changed) if not.

        Every record of a tier is one slot, so all are ``nbytes`` long and one ``evict(n)``
        call frees exactly enough. Victims leave the index at once (their files are the
        caller's to delete); pinned and in-flight records are never among them.
        """
        deficit = self.used_bytes + self.reserved_bytes + nbytes - limit
        if deficit <= 0:
            return []
        if nbytes > limit:
            return None
        if not self._entries:
            return None
        unit = nbytes or next(iter(self._entries.values())).nbytes
        n = -(-deficit // unit)
        if n > len(self._entries):
            return None
        chosen = self.policy.evict(n, protected)
        if chosen is None:
            return None
        victims = []
        for key, _status in chosen:
            entry = self._entries.pop(key)
            self.used_bytes -= entry.nbytes
            victims.append((key, entry))
        return victims

    def begin_write(self, key: OffloadKey, path: str, nbytes: int) -> IndexEntry:
        """Reserve ``nbytes`` for a record being written (never evictable while it is)."""
        entry = IndexEntry(path, nbytes, self._status(-1))
        self._entries[key] = entry
        self.reserved_bytes += nbytes
        self.policy.insert(key, entry.status)
        return entry

    def end_write(self, key: OffloadKey, ok: bool, mtime: float = 0.0) -> None:
        """A write finished: its bytes count as used (still unreadable until published)."""
        entry = self._entries[key]
        self.reserved_bytes -= entry.nbytes
        if ok:
            entry.mtime = mtime
            self.used_bytes += entry.nbytes
        else:
            del self._entries[key]
            self.policy.remove(key)

    def publish(self, keys: list[OffloadKey]) -> None:
        """Make written records readable and evictable, in the order given.

        The tier publishes a job's records together when the job ends, tail to head, so the
        policy sees the same order however the I/O threads finished.
        """
        for key in keys:
            entry = self._entries[key]
            entry.status.ref_cnt = 0
            self.policy.mark_evictable(key)

    def begin_read(self, key: OffloadKey) -> IndexEntry | None:
        """Pin a ready record for a read (``None`` if absent, being written or doomed)."""
        entry = self._entries.get(key)
        if entry is None or entry.status.ref_cnt < 0 or entry.doomed:
            return None
        entry.status.ref_cnt += 1
        if entry.status.ref_cnt == 1:
            self.policy.mark_non_evictable(key)
        return entry

    def end_read(self, key: OffloadKey, corrupt: bool) -> IndexEntry | None:
        """Unpin; returns the entry when it must now be deleted (found corrupt)."""
        entry = self._entries[key]
        entry.status.ref_cnt -= 1
        if corrupt:
            entry.doomed = True
        if entry.status.ref_cnt > 0:
            return None
        if entry.doomed:
            del self._entries[key]
            self.used_bytes -= entry.nbytes
            self.policy.remove(key)
            return entry
        self.policy.mark_evictable(key)
        return None

    def remove_ready(self, key: OffloadKey) -> IndexEntry | None:
        """Drop an unpinned record (a delete); ``None`` if it is pinned or being written."""
        entry = self._entries.get(key)
        if entry is None or entry.status.ref_cnt != 0:
            return None
        del self._entries[key]
        self.used_bytes -= entry.nbytes
        self.policy.remove(key)
        return entry


__all__ = ["DiskIndex", "IndexEntry"]
