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

SLOT = 8192


class Faulty(FileLayer):
    """A file layer whose next calls fail in the way a test asks."""

    def __init__(self) -> None:
        self.write_error: int | None = None
        self.read_error: int | None = None
        self.short_read = False
        self.replace_error: Exception | None = None
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
            # the first call returns half of what was asked, then end of file
            if offset:
                return 0
            wanted = sum(b.nbytes for b in buffers) // 2
            return super().preadv(fd, [buffers[0], buffers[1][: wanted - buffers[0].nbytes]], 0)
        return super().preadv(fd, buffers, offset)

    def replace(self, src: str, dst: str) -> None:
        if self.replace_error is not None:
            raise self.replace_error
        super().replace(src, dst)


def _setup(tmp_path: Path, **kw: object) -> tuple[DiskTier, BytearraySlotMemory, Faulty, bytes]:
    memory = BytearraySlotMemory(SLOT, 4)
    data = random.Random(1).randbytes(SLOT)
    memory.slot_view(0)[:] = data
    files = Faulty()
    tier = DiskTier(memory, tmp_path, 8 * (HEADER_BYTES + SLOT), files=files, **kw)  # type: ignore[arg-type]
    return tier, memory, files, data


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
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.kv"))
    files.write_error = None  # the tier recovers once the disk does
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    tier.close()


def test_a_failed_rename_and_an_unexpected_exception_are_failed_stores(tmp_path: Path) -> None:
    tier, _memory, files, _data = _setup(tmp_path)
    files.replace_error = OSError(errno.EROFS, "read-only")
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).reasons == {0: "io_error"}
    files.replace_error = None
    files.weird = RuntimeError("a bug in a file layer")
    assert _run(tier, tier.submit_put([conformance_key(2)], [0])).reasons == {0: "io_error"}
    assert not list(tmp_path.rglob("*.tmp"))
    tier.close()


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
    assert not list(tmp_path.rglob("*.kv"))
    tier.close()


@pytest.mark.parametrize("where", ["payload", "header", "key"])
def test_a_flipped_byte_on_disk_is_never_served(tmp_path: Path, where: str) -> None:
    tier, _memory, _files, _data = _setup(tmp_path)
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    (path,) = tmp_path.rglob("*.kv")
    offset = {"payload": HEADER_BYTES + SLOT // 2, "header": 12, "key": 70}[where]
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x20
    path.write_bytes(bytes(raw))
    get = _run(tier, tier.submit_get([conformance_key(1)], [1]))
    assert get.ok == (False,) and get.reasons == {0: "corrupt"}
    assert tier.stats()["corrupt_records"] == 1
    assert tier.contains([conformance_key(1)]) == [Presence.MISS]
    assert not path.exists()
    tier.close()


def test_restart_deletes_temporaries_torn_and_garbled_records(tmp_path: Path) -> None:
    tier, _memory, _files, _data = _setup(tmp_path)
    keys = [conformance_key(i) for i in range(4)]
    assert _run(tier, tier.submit_put(keys, [0, 0, 0, 0])).all_ok
    tier.close()
    paths = sorted(tmp_path.rglob("*.kv"))
    paths[0].write_bytes(paths[0].read_bytes()[: HEADER_BYTES + 100])  # torn
    raw = bytearray(paths[1].read_bytes())
    raw[0] ^= 1  # bad magic
    paths[1].write_bytes(bytes(raw))
    (paths[2].parent / (paths[2].name + ".1.2.tmp")).write_bytes(b"partial")
    fresh = DiskTier(_memory, tmp_path, 8 * (HEADER_BYTES + SLOT))
    stats = fresh.stats()
    assert stats["records"] == 2 and stats["torn_records"] == 2 and stats["temp_removed"] == 1
    assert not paths[0].exists() and not paths[1].exists()
    assert not list(tmp_path.rglob("*.tmp"))
    fresh.close()
