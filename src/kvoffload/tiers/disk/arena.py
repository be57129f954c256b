"""The disk tier's arena file: records written, read, verified, erased and scanned in place.

Why apart from the tier: this is the medium's I/O and its crash-safe write order, with no
index, budget or job in it; the tier decides which slots to touch and this module touches them.
The write order (``records`` has the layout): in file order a record is header, payload, stamp,
and the stamp names its header's write, so one sequential write of a run of adjacent records
(1) replaces each slot's header, which kills the old record, (2) writes its payload, (3) writes
its stamp. A process killed at any point leaves a slot that is empty, holds the old record
whole (killed before 1), or holds the new one whole.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import SlotMemory
from kvoffload.tiers.disk.io import FileLayer, read_full, write_all
from kvoffload.tiers.disk.records import (
    HEADER_BYTES,
    STAMP_BYTES,
    ChecksumKind,
    HeaderPacker,
    RecordError,
    RecordHeader,
    checksum_function,
    decode_header,
    is_empty,
    stamp_bytes,
    stamp_commits,
)
from kvoffload.tiers.disk.tasks import RunItem

ZERO_FIELDS = memoryview(bytes(HEADER_BYTES - STAMP_BYTES))  # a header page after its stamp


@dataclass
class ScanReport:
    """What the start-up scan found in the arena file (the index is the tier's to fill)."""

    found: list[tuple[int, OffloadKey, int]] = field(default_factory=list)  # (ns, key, slot)
    free: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # unreadable this run: out of use
    torn: int = 0
    slots: int = 0  # arena slots the file holds within the budget
    cut_slots: int = 0  # whole slots past the budget, cut off the file


class Arena:
    """The arena file of one namespace and block size, and every read and write of it."""

    def __init__(
        self,
        memory: SlotMemory,
        files: FileLayer,
        fd: int,
        namespace: bytes,
        checksum_kind: ChecksumKind,
        checksum_fn: Callable[[memoryview], int],
        durability: str,
    ) -> None:
        self.memory = memory
        self.files = files
        self.fd = fd
        self.namespace = namespace
        self.record_bytes = HEADER_BYTES + memory.slot_bytes
        self.durability = durability
        self._packer = HeaderPacker(namespace, checksum_kind)
        self._checksum_fn = checksum_fn
        # one store write in the kernel at a time: buffered writes to one file serialise on its
        # inode lock anyway, where waiters spin on a CPU the other threads' checksums could use
        self._write_lock = threading.Lock()
        # every record write gets its own id, named by its header and its commit stamp, so
        # an old stamp can never commit a new header (random start: ids differ across runs)
        self._write_ids = itertools.count(int.from_bytes(os.urandom(8), "little") >> 2)

    # ----------------------------------------------------------------- stores

    def write_run(self, items: list[RunItem]) -> int:
        """Write records into adjacent arena slots, each stamp after its payload; the time
        stamped in their headers.

        Under ``none`` and ``rename`` one vectored write lays down, in file order, each
        record's header page (which kills the slot's old record: its stamp no longer matches),
        its payload, then its stamp (which commits it): a killed process leaves every slot
        empty, holding its old record or holding its new one whole. Under ``fsync`` the steps
        are apart, with a barrier after each. The stamp of the run's last record falls in the next
        slot's header page, before that slot's header, so no write touches a record outside
        the run.
        """
        written_ns = time.time_ns()
        if self.durability == "fsync":
            return self._write_run_synced(items, written_ns)
        _pages, body, _stamps = self._encode_run(items, written_ns, stamped=True)
        first = items[0].arena * self.record_bytes + STAMP_BYTES
        with self._write_lock:
            write_all(self.files, self.fd, body, first, len(items) * self.record_bytes)
        return written_ns

    def _encode_run(
        self, items: list[RunItem], written_ns: int, stamped: bool
    ) -> tuple[bytearray, list[memoryview], list[bytes]]:
        """The header pages of a run of adjacent records, the buffers of its one sequential
        write (header fields, payload, ..., last stamp) and each record's stamp, which is in
        the pages already when ``stamped`` (else those areas stay zero)."""
        slot_view, checksum, ids = self.memory.slot_view, self._checksum_fn, self._write_ids
        fields_of = self._packer.fields
        # header pages of the run, back to back, then the last record's stamp
        pages = bytearray(HEADER_BYTES * len(items) + STAMP_BYTES)
        pv = memoryview(pages)
        # the first page's stamp area is the previous slot's record's: start after it
        body: list[memoryview] = [pv[STAMP_BYTES:HEADER_BYTES]]
        stamps: list[bytes] = []
        offset = 0
        for item in items:
            view = slot_view(item.slot)
            write_id = next(ids)
            fields, crc = fields_of(item.key, view.nbytes, checksum(view), written_ns, write_id)
            pages[offset + STAMP_BYTES : offset + STAMP_BYTES + len(fields)] = fields
            offset += HEADER_BYTES
            stamp = stamp_bytes(crc, write_id)
            if stamped:  # in the next page's first bytes: written after this payload
                pages[offset : offset + len(stamp)] = stamp
            stamps.append(stamp)
            # the next page (after the last payload: the pages' tail, its stamp alone)
            body += (view, pv[offset : offset + HEADER_BYTES])
        return pages, body, stamps

    def _write_run_synced(self, items: list[RunItem], written_ns: int) -> int:
        """The ``fsync`` write order: old headers of reused slots zeroed, then headers and
        payloads with zero stamps, then the stamps; a barrier after each step."""
        files, fd, record_bytes = self.files, self.fd, self.record_bytes
        pages, body, stamps = self._encode_run(items, written_ns, stamped=False)
        pv = memoryview(pages)
        first = items[0].arena * record_bytes + STAMP_BYTES
        total = len(items) * record_bytes
        reused = [item.arena for item in items if not item.entry.fresh]
        for arena_slot in reused:  # power loss must not find an old header over new bytes
            write_all(files, fd, (ZERO_FIELDS,), arena_slot * record_bytes + STAMP_BYTES)
        if reused:
            files.fdatasync(fd)
        write_all(files, fd, body, first, total)
        files.fdatasync(fd)
        for k, stamp in enumerate(stamps, 1):
            at = k * HEADER_BYTES
            pages[at : at + len(stamp)] = stamp
            area = pv[at : at + STAMP_BYTES]
            write_all(files, fd, (area,), (items[k - 1].arena + 1) * record_bytes, STAMP_BYTES)
        files.fdatasync(fd)
        return written_ns

    # ----------------------------------------------------------------- loads

    def read_run(self, items: list[RunItem]) -> list[str | None]:
        """Read adjacent records into their host slots in one call, then verify each: per
        item, why it is not its key's bytes (``"torn"``, ``"corrupt"``, ...) or ``None``."""
        views = [self.memory.slot_view(item.slot) for item in items]
        header_bufs = memoryview(bytearray(HEADER_BYTES * len(items)))
        body: list[memoryview] = []
        for k, view in enumerate(views):
            body += (header_bufs[k * HEADER_BYTES : (k + 1) * HEADER_BYTES], view)
        n = read_full(self.files, self.fd, body, items[0].arena * self.record_bytes)
        out: list[str | None] = []
        for k, (item, view) in enumerate(zip(items, views, strict=True)):
            if n < (k + 1) * self.record_bytes:
                out.append("torn")
                continue
            header_buf = header_bufs[k * HEADER_BYTES : (k + 1) * HEADER_BYTES]
            out.append(self.verify(item.key, header_buf, view))
        return out

    def verify(self, key: OffloadKey, header_buf: memoryview, view: memoryview) -> str | None:
        """Why the record read into ``view`` is not ``key``'s bytes, or ``None`` if it is."""
        try:
            header = decode_header(header_buf)
        except RecordError:
            return "corrupt"
        if header.key != key or header.namespace != self.namespace:
            return "corrupt"
        if header.payload_len != view.nbytes:
            return "corrupt"
        fn = checksum_function(header.checksum_kind)
        if fn is None:
            return "unverifiable"
        if fn(view) != header.payload_checksum:
            return "corrupt"
        return None

    # ----------------------------------------------------------------- erasure

    def erase(self, arena_slot: int) -> None:
        """Zero a record's header fields (not the page's first bytes: the previous slot's
        stamp), with a barrier under ``fsync``; raises when the write fails."""
        offset = arena_slot * self.record_bytes + STAMP_BYTES
        write_all(self.files, self.fd, (ZERO_FIELDS,), offset)
        if self.durability == "fsync":
            self.files.fdatasync(self.fd)

    def zero_quietly(self, arena_slot: int) -> None:
        """Zero a slot's header fields, ignoring a failure (the next scan finds it again)."""
        offset = arena_slot * self.record_bytes + STAMP_BYTES
        with contextlib.suppress(OSError):
            write_all(self.files, self.fd, (ZERO_FIELDS,), offset)

    # ----------------------------------------------------------------- restart scan

    def scan(self, max_slots: int, verify_payloads: bool) -> ScanReport:
        """Read every header page and commit stamp of the file, within ``max_slots`` slots.

        A record counts only with its commit stamp (the next header page's first bytes, or the
        file's tail). Torn, uncommitted or foreign headers are zeroed and counted; slots past
        ``max_slots`` are cut off the file. A slot whose read fails (EIO, perhaps transient)
        proves nothing: it is skipped, neither zeroed nor free, and so is the slot before it
        (whose stamp it holds); the next start reads both again.
        """
        files, fd, record_bytes = self.files, self.fd, self.record_bytes
        try:
            size = files.size(fd)
        except OSError:
            size = 0
        whole = size // record_bytes
        slots = min(whole, max_slots)
        report = ScanReport(slots=slots, cut_slots=max(0, whole - max_slots))
        if size % record_bytes not in (0, STAMP_BYTES):
            report.torn += 1  # a trailing partial slot: a write cut short
        page = memoryview(bytearray(HEADER_BYTES))
        pending: tuple[int, RecordHeader] | None = None  # a header waiting for its stamp
        for arena_slot in range(slots + 1):
            offset = arena_slot * record_bytes
            want = page if arena_slot < slots else page[:STAMP_BYTES]  # the tail: a stamp
            try:
                n = read_full(files, fd, [want], offset)
            except OSError:
                n = -1
            if pending is not None:
                last, header = pending
                pending = None
                if n < 0:  # its stamp could not be read: unknown, not torn
                    report.skipped.append(last)
                elif n >= STAMP_BYTES and stamp_commits(page[:STAMP_BYTES], header):
                    report.found.append((header.written_ns, OffloadKey(header.key), last))
                else:  # header written, payload maybe not: never committed
                    report.torn += 1
                    self.zero_quietly(last)
                    report.free.append(last)
            if arena_slot == slots:
                break
            if n < 0:
                report.skipped.append(arena_slot)
                continue
            if n == HEADER_BYTES and is_empty(page):
                report.free.append(arena_slot)
                continue
            try:
                checked = self._check_slot(page, n, offset, size, verify_payloads)
            except OSError:  # the payload could not be read (verify_payloads)
                report.skipped.append(arena_slot)
                continue
            if checked is None:
                report.torn += 1
                self.zero_quietly(arena_slot)
                report.free.append(arena_slot)
                continue
            pending = (arena_slot, checked)
        # the file holds its slots and the last one's stamp; cut a partial slot, or the
        # slots past a budget that shrank, off the file
        target = slots * record_bytes + STAMP_BYTES if slots else 0
        if size != target:
            with contextlib.suppress(OSError):
                files.truncate(fd, target)
        return report

    def _check_slot(
        self, header_buf: memoryview, n: int, offset: int, size: int, verify_payload: bool
    ) -> RecordHeader | None:
        """The record's header if it (and its payload, if asked) is right; stamp not checked.

        Raises ``OSError`` when the payload cannot be read (the caller skips the slot)."""
        if n != HEADER_BYTES or offset + self.record_bytes > size:
            return None
        try:
            header = decode_header(header_buf)
        except RecordError:
            return None
        if header.namespace != self.namespace or header.payload_len != self.memory.slot_bytes:
            return None
        if verify_payload:
            fn = checksum_function(header.checksum_kind)
            payload = bytearray(header.payload_len)
            # an OSError goes to the caller: an unreadable payload is not a bad one
            got = read_full(self.files, self.fd, [memoryview(payload)], offset + HEADER_BYTES)
            if (
                fn is None
                or got != header.payload_len
                or fn(memoryview(payload)) != header.payload_checksum
            ):
                return None
        return header


__all__ = ["ZERO_FIELDS", "Arena", "ScanReport"]
