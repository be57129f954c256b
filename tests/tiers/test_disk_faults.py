"""Faults through a swappable file layer: each a counted miss or failed store, never an escape."""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

from kvoffload.testing.tiers import conformance_key
from kvoffload.tiers import BytearraySlotMemory, Presence, TierResult
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier
from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import STAMP_BYTES

SLOT = 8192


class Faulty(FileLayer):
    """A file layer whose next calls fail in the way a test asks."""

    def __init__(self) -> None:
        self.write_error: int | None = None
        self.read_error: int | None = None
        self.short_read = False
        self.sync_error: int | None = None
        self.weird: Exception | None = None

    def pwritev(self, fd, buffers, offset):  # type: ignore[no-untyped-def]
        if self.write_error is not None:
            raise OSError(self.write_error, "injected")
        if self.weird is not None:
            raise self.weird
        return super().pwritev(fd, buffers, offset)

    def preadv(self, fd, buffers, offset):  # type: ignore[no-untyped-def]
        if self.read_error is not None:
            raise OSError(self.read_error, "injected")
        if self.short_read:
            # a record read returns its header and half its payload, then end of file
            if len(buffers) < 2:
                return 0
            half = buffers[1][: buffers[1].nbytes // 2]
            return super().preadv(fd, [buffers[0], half], offset)
        return super().preadv(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        if self.sync_error is not None:
            raise OSError(self.sync_error, "injected")
        super().fdatasync(fd)


def _setup(tmp_path: Path, **kw: object) -> tuple[DiskTier, BytearraySlotMemory, Faulty, bytes]:
    memory = BytearraySlotMemory(SLOT, 4)
    data = random.Random(1).randbytes(SLOT)
    memory.slot_view(0)[:] = data
    files = Faulty()
    tier = DiskTier(memory, tmp_path, 8 * (HEADER_BYTES + SLOT), files=files, **kw)  # type: ignore[arg-type]
    return tier, memory, files, data


def _records_after_restart(tmp_path: Path) -> int:
    fresh = DiskTier(BytearraySlotMemory(SLOT, 1), tmp_path, 8 * (HEADER_BYTES + SLOT))
    n = int(fresh.stats()["records"])
    fresh.close()
    return n


def _run(tier: DiskTier, job: int) -> TierResult:
    assert tier.drain(10.0)
    (result,) = [r for r in tier.poll() if r.job_id == job]
    return result


@pytest.mark.parametrize(("error", "reason"), [(errno.ENOSPC, "no_space"), (errno.EIO, "io_error")])
def test_a_failed_write_is_a_counted_failed_store(tmp_path: Path, error: int, reason: str) -> None:
    tier, memory, files, data = _setup(tmp_path)
    files.write_error = error
    put = _run(tier, tier.submit_put([conformance_key(1)], [0]))
    assert put.ok == (False,) and put.reasons == {0: reason}
    assert tier.contains([conformance_key(1)]) == [Presence.MISS]
    assert tier.stats()[f"dropped_{reason}"] == 1
    assert tier.stats()["reserved_bytes"] == 0 and tier.stats()["used_bytes"] == 0
    assert bytes(memory.slot_view(0)) == data  # the CPU copy is untouched
    files.write_error = None  # the tier recovers once the disk does
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    tier.close()
    assert _records_after_restart(tmp_path) == 1


def test_a_failed_barrier_and_an_unexpected_exception_are_failed_stores(tmp_path: Path) -> None:
    tier, _memory, files, _data = _setup(tmp_path, durability="fsync")
    files.sync_error = errno.EIO
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).reasons == {0: "io_error"}
    files.sync_error = None
    files.weird = RuntimeError("a bug in a file layer")
    assert _run(tier, tier.submit_put([conformance_key(2)], [0])).reasons == {0: "io_error"}
    assert tier.stats()["dropped_io_error"] == 2 and tier.stats()["records"] == 0
    tier.close()
    assert _records_after_restart(tmp_path) == 0  # no header was written for either


def test_a_read_error_is_a_counted_miss_and_keeps_the_record(tmp_path: Path) -> None:
    tier, memory, files, data = _setup(tmp_path)
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    files.read_error = errno.EIO
    get = _run(tier, tier.submit_get([conformance_key(1)], [1]))
    assert get.ok == (False,) and get.reasons == {0: "io_error"}
    assert tier.stats()["get_failed_io_error"] == 1
    files.read_error = None  # a transient error: the record is still served afterwards
    assert _run(tier, tier.submit_get([conformance_key(1)], [1])).all_ok
    assert bytes(memory.slot_view(1)) == data
    tier.close()


def test_a_short_read_is_a_torn_record_deleted_and_counted(tmp_path: Path) -> None:
    tier, _memory, files, _data = _setup(tmp_path)
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    files.short_read = True
    get = _run(tier, tier.submit_get([conformance_key(1)], [1]))
    assert get.reasons == {0: "torn"}
    assert tier.stats()["corrupt_records"] == 1
    assert tier.contains([conformance_key(1)]) == [Presence.MISS]
    tier.close()


@pytest.mark.parametrize("where", ["payload", "header", "key"])
def test_a_flipped_byte_on_disk_is_never_served(tmp_path: Path, where: str) -> None:
    tier, _memory, _files, _data = _setup(tmp_path)
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    (path,) = tmp_path.rglob("*.kv")
    # header fields start after the page's first STAMP_BYTES (the previous slot's stamp)
    offset = {"payload": HEADER_BYTES + SLOT // 2, "header": 12, "key": 70}[where]
    offset += 0 if where == "payload" else STAMP_BYTES
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x20
    path.write_bytes(bytes(raw))
    get = _run(tier, tier.submit_get([conformance_key(1)], [1]))
    assert get.ok == (False,) and get.reasons == {0: "corrupt"}
    assert tier.stats()["corrupt_records"] == 1
    assert tier.contains([conformance_key(1)]) == [Presence.MISS]
    tier.close()
    assert _records_after_restart(tmp_path) == 0  # its header was erased


def test_restart_erases_torn_and_garbled_records(tmp_path: Path) -> None:
    tier, memory, _files, _data = _setup(tmp_path)
    keys = [conformance_key(i) for i in range(4)]
    assert _run(tier, tier.submit_put(keys, [0, 0, 0, 0])).all_ok
    tier.close()
    (arena,) = tmp_path.rglob("*.kv")
    record = HEADER_BYTES + SLOT
    raw = bytearray(arena.read_bytes())
    raw[record * 1 + STAMP_BYTES] ^= 1  # slot 1: bad magic
    raw[record * 2 + STAMP_BYTES + 40] ^= 1  # slot 2: a header field, caught by the header CRC
    arena.write_bytes(bytes(raw[: record * 3 + HEADER_BYTES + 100]))  # slot 3: cut short
    fresh = DiskTier(memory, tmp_path, 8 * (HEADER_BYTES + SLOT))
    stats = fresh.stats()
    assert stats["records"] == 1 and stats["torn_records"] == 3
    assert fresh.contains(keys) == [Presence.HIT, Presence.MISS, Presence.MISS, Presence.MISS]
    # the partial slot is cut off; slot 2's stamp (the next page's first bytes) stays
    assert arena.stat().st_size == 3 * record + STAMP_BYTES
    fresh.close()
    assert _records_after_restart(tmp_path) == 1  # the bad headers were zeroed, not re-counted


class FlakyScanReads(FileLayer):
    """Each read at one of ``offsets`` fails once with EIO (a transient fault), then works."""

    def __init__(self, offsets: set[int]) -> None:
        self.offsets = set(offsets)

    def preadv(self, fd, buffers, offset):  # type: ignore[no-untyped-def]
        if offset in self.offsets:
            self.offsets.discard(offset)
            raise OSError(errno.EIO, "injected")
        return super().preadv(fd, buffers, offset)


@pytest.mark.parametrize("where", ["header", "payload"])
def test_a_transient_eio_at_the_restart_scan_erases_no_record(tmp_path: Path, where: str) -> None:
    record = HEADER_BYTES + SLOT
    memory = BytearraySlotMemory(SLOT, 1)
    tier = DiskTier(memory, tmp_path, 32 * record)
    for i in range(20):
        memory.slot_view(0)[:] = random.Random(i).randbytes(SLOT)
        assert _run(tier, tier.submit_put([conformance_key(i)], [0])).all_ok
    tier.close()
    # slots 5 and 12 cannot be read once each during the next start's scan
    at = 0 if where == "header" else HEADER_BYTES
    files = FlakyScanReads({5 * record + at, 12 * record + at})
    verify = where == "payload"  # the payload is read at the scan only when verified
    flaky = DiskTier(memory, tmp_path, 32 * record, files=files, verify_on_scan=verify)
    stats = flaky.stats()
    skipped = 4 if where == "header" else 2  # a header read also holds the previous stamp
    assert stats["torn_records"] == 0 and stats["records"] == 20 - skipped
    assert stats["unreadable_slots"] == skipped
    # the skipped slots are not handed out: new records go past every slot of the file
    for i in range(100, 108):
        memory.slot_view(0)[:] = random.Random(i).randbytes(SLOT)
        assert _run(flaky, flaky.submit_put([conformance_key(i)], [0])).all_ok
    flaky.close()
    again = DiskTier(memory, tmp_path, 32 * record)
    assert again.stats()["records"] == 28 and again.stats()["unreadable_slots"] == 0
    for i in (4, 5, 11, 12):
        assert _run(again, again.submit_get([conformance_key(i)], [0])).all_ok
        assert bytes(memory.slot_view(0)) == random.Random(i).randbytes(SLOT)
    again.close()


def test_a_full_tier_with_a_skipped_slot_evicts_instead_of_failing(tmp_path: Path) -> None:
    record = HEADER_BYTES + SLOT
    memory = BytearraySlotMemory(SLOT, 1)
    tier = DiskTier(memory, tmp_path, 8 * record)
    for i in range(8):
        assert _run(tier, tier.submit_put([conformance_key(i)], [0])).all_ok
    tier.close()
    flaky = DiskTier(
        memory,
        tmp_path,
        8 * record,
        files=FlakyScanReads({3 * record + HEADER_BYTES}),
        verify_on_scan=True,
    )
    assert flaky.stats()["records"] == 7
    results = [_run(flaky, flaky.submit_put([conformance_key(i)], [0])) for i in range(50, 60)]
    assert all(r.all_ok for r in results)  # a slot out of use still counts: evict, not fail
    assert flaky.stats()["records"] == 7
    flaky.close()
