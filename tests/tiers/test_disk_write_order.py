"""The store's write order, cut at every point: a fresh tier never serves a torn record.

A SIGKILL stops a buffered write between pages, and the kernel copies a write's buffers in
file order; :class:`CutAt` reproduces that deterministically (the write's first ``cut`` bytes
reach the file, then the process "dies"), for each system call of a store of a run of
records over slots that held other records. Also: a run goes to the file in one call, format 1
arenas are refused untouched, and a record without its commit stamp is not recovered.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from kvoffload.testing.tiers import conformance_key
from kvoffload.tiers import BytearraySlotMemory, Presence, TierResult
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier
from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import STAMP_BYTES

SLOT = 8192
RECORD = HEADER_BYTES + SLOT
N = 3  # records per run


class Killed(Exception):
    """The simulated process death: nothing after the cut reaches the file."""


class CutAt(FileLayer):
    """Counts write calls; once armed, call number ``call`` writes ``cut`` bytes and dies."""

    def __init__(self) -> None:
        self.armed = False
        self.call = -1
        self.cut = 0
        self.sizes: list[int] = []
        self.syncs = 0

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if not self.armed:
            return super().pwritev(fd, buffers, offset)
        self.sizes.append(sum(b.nbytes for b in buffers))
        if len(self.sizes) - 1 == self.call:
            data = b"".join(bytes(b) for b in buffers)[: self.cut]
            os.pwrite(fd, data, offset)
            self.armed = False
            raise Killed
        if len(self.sizes) - 1 > self.call >= 0:
            raise Killed  # dead: later calls never happen
        return super().pwritev(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        if self.armed:
            self.syncs += 1
        super().fdatasync(fd)


def _block(tag: str, i: int) -> bytes:
    return random.Random(f"{tag}{i}").randbytes(SLOT)


def _old_and_new(path: Path, durability: str, files: CutAt) -> tuple[list[bytes], list[bytes]]:
    """Store N old records, then N new ones over the same slots (the budget is N records)."""
    memory = BytearraySlotMemory(SLOT, N)
    tier = DiskTier(memory, path, N * RECORD, durability=durability, files=files, io_threads=1)
    old = [conformance_key(i) for i in range(N)]
    new = [conformance_key(100 + i) for i in range(N)]
    for i in range(N):
        memory.slot_view(i)[:] = _block("old", i)
    _run(tier, tier.submit_put(old, list(range(N))))
    for i in range(N):
        memory.slot_view(i)[:] = _block("new", i)
    files.armed = True
    result = _run(tier, tier.submit_put(new, list(range(N))))
    files.armed = False
    if files.call < 0:  # the counting pass: the run went through whole
        assert result.all_ok and set(result.evicted) == set(old)
    tier.close()
    return old, new


def _run(tier: DiskTier, job: int) -> TierResult:
    assert tier.drain(10.0)
    (result,) = [r for r in tier.poll() if r.job_id == job]
    return result


def _served(path: Path) -> dict[bytes, bytes]:
    memory = BytearraySlotMemory(SLOT, 1)
    tier = DiskTier(memory, path, N * RECORD)
    out = {}
    for scanned in tier.scan():
        result = _run(tier, tier.submit_get([scanned.key], [0]))
        assert result.all_ok, f"a record the scan found was not served: {result.reasons}"
        out[scanned.key] = bytes(memory.slot_view(0))
    tier.close()
    return out


@pytest.mark.parametrize("durability", ["rename", "fsync"])
def test_a_store_cut_anywhere_leaves_old_or_new_records_whole(
    tmp_path: Path, durability: str
) -> None:
    files = CutAt()
    _old_and_new(tmp_path / "count", durability, files)
    sizes = files.sizes
    if durability == "rename":
        assert sizes == [N * RECORD]  # one sequential write for the whole run
    else:  # reused headers zeroed, then the run with zero stamps, then each stamp
        assert len(sizes) == 2 * N + 1 and files.syncs == 3
    cuts = 0
    for call, size in enumerate(sizes):
        last_crc_byte = size - STAMP_BYTES + 27  # the run's last stamp, but for its CRC's end
        points = {*range(0, size, 512), *range(STAMP_BYTES - 2, size, RECORD), size - 1}
        points = sorted(points | {last_crc_byte})
        for cut in points:
            path = tmp_path / f"cut-{call}-{cut}"
            files = CutAt()
            files.call, files.cut = call, cut
            old, new = _old_and_new(path, durability, files)
            served = _served(path)
            # each slot holds the old record, the new one or neither, and serves it whole
            assert len(served) <= N and set(served) <= {*old, *new}, (call, cut)
            for i in range(N):
                if old[i] in served:
                    assert served[old[i]] == _block("old", i), (call, cut, i)
                if new[i] in served:
                    assert served[new[i]] == _block("new", i), (call, cut, i)
            if call == len(sizes) - 1 and cut == last_crc_byte:  # all but the last committed
                assert len(served) == N - 1 and set(served) <= set(new), (call, cut)
            cuts += 1
    assert cuts > 20


def test_a_record_without_its_commit_stamp_is_erased_on_restart(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(SLOT, N)
    tier = DiskTier(memory, tmp_path, N * RECORD)
    keys = [conformance_key(i) for i in range(N)]
    assert _run(tier, tier.submit_put(keys, list(range(N)))).all_ok
    tier.close()
    with open(tier.arena_path, "r+b") as f:  # slot 1's stamp is slot 2's page's first bytes
        f.seek(2 * RECORD)
        f.write(bytes(STAMP_BYTES))
    fresh = DiskTier(memory, tmp_path, N * RECORD)
    assert fresh.stats()["torn_records"] == 1
    assert fresh.contains(keys) == [Presence.HIT, Presence.MISS, Presence.HIT]
    fresh.close()
    again = DiskTier(memory, tmp_path, N * RECORD)  # its header was zeroed: not found again
    assert again.stats()["torn_records"] == 0 and again.stats()["records"] == 2
    again.close()


def test_a_format_1_arena_is_refused_and_left_untouched(tmp_path: Path) -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    probe = DiskTier(memory, tmp_path, N * RECORD)
    probe.close()
    legacy = Path(probe.legacy_arena_path)
    assert legacy.name == f"arena-{SLOT}.kv" and probe.arena_path.endswith(".v2.kv")
    # a format 1 record: its header at the page's first byte, version 1, no stamp
    head = struct.pack("<8sHHBBHQQQ32s", b"KVOFFBLK", 1, HEADER_BYTES, 1, 0, 36, SLOT, 0, 0, b"")
    raw = (head + bytes(HEADER_BYTES - len(head)) + _block("v1", 0)) * 2
    legacy.write_bytes(raw)
    tier = DiskTier(memory, tmp_path, N * RECORD)
    stats = tier.stats()
    assert stats["records"] == 0 and stats["torn_records"] == 0
    assert stats["legacy_arena_bytes"] == len(raw)
    assert _run(tier, tier.submit_put([conformance_key(1)], [0])).all_ok
    tier.close()
    assert legacy.read_bytes() == raw  # neither read as records nor erased


@pytest.mark.parametrize(("slot", "calls"), [(64 * 1024, 1), (1 << 20, 2)])
def test_a_put_job_is_split_into_tasks_of_at_least_4_mib(
    tmp_path: Path, slot: int, calls: int
) -> None:
    """16 small records: one task, one write; 8 records of 1 MiB: two tasks of 4 records."""
    n = 16 if slot < 1 << 20 else 8
    memory = BytearraySlotMemory(slot, n)
    files = CutAt()
    tier = DiskTier(memory, tmp_path, n * (HEADER_BYTES + slot), files=files, io_threads=4)
    files.armed = True
    keys = [conformance_key(i) for i in range(n)]
    assert _run(tier, tier.submit_put(keys, list(range(n)))).all_ok
    tier.close()
    assert len(files.sizes) == calls and sum(files.sizes) == n * (HEADER_BYTES + slot)


class CountReads(FileLayer):
    """Counts read calls and their sizes (the reads of one job, once armed)."""

    def __init__(self) -> None:
        self.armed = False
        self.sizes: list[int] = []

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if self.armed:
            self.sizes.append(sum(b.nbytes for b in buffers))
        return super().preadv(fd, buffers, offset)


@pytest.mark.parametrize(("slot", "n", "calls"), [(64 * 1024, 16, 1), (1 << 20, 8, 4)])
def test_a_get_job_is_split_into_tasks_of_at_least_1_mib(
    tmp_path: Path, slot: int, n: int, calls: int
) -> None:
    """16 records of 64 KiB: one 1.06 MiB read; 8 of 1 MiB: one task per thread (4 x 2)."""
    memory = BytearraySlotMemory(slot, 2 * n)
    for b in range(n):
        memory.slot_view(b)[:4] = b.to_bytes(4, "little")
    files = CountReads()
    tier = DiskTier(memory, tmp_path, n * (HEADER_BYTES + slot), files=files, io_threads=4)
    keys = [conformance_key(i) for i in range(n)]
    assert _run(tier, tier.submit_put(keys, list(range(n)))).all_ok
    files.armed = True
    assert _run(tier, tier.submit_get(keys, list(range(n, 2 * n)))).all_ok
    tier.close()
    assert len(files.sizes) == calls and sum(files.sizes) == n * (HEADER_BYTES + slot)
    assert all(bytes(memory.slot_view(n + b)) == bytes(memory.slot_view(b)) for b in range(n))
