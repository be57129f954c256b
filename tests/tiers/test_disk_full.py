"""A full disk: failed writes into fresh slots are not counted as on disk, and the tier evicts
its own records to keep storing (injected through the file layer, then on a real tmpfs that
another program fills)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kvoffload.testing.tiers import conformance_key
from kvoffload.tiers import BytearraySlotMemory, TierResult
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier
from kvoffload.tiers.disk.io import FileLayer

SLOT = 8192
RECORD = HEADER_BYTES + SLOT


class FullDisk(FileLayer):
    """While ``full``: a write that would grow the arena file fails with ENOSPC and the
    filesystem reports no free space (what a disk another program filled does)."""

    def __init__(self) -> None:
        self.full = False

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if self.full and offset + sum(b.nbytes for b in buffers) > os.fstat(fd).st_size:
            raise OSError(errno.ENOSPC, "injected: no space left on device")
        return super().pwritev(fd, buffers, offset)

    def free_bytes(self, path: str) -> int:
        return 0 if self.full else super().free_bytes(path)


def _fill(k: bytes) -> bytes:
    return (k * (SLOT // len(k) + 1))[:SLOT]


def _put(tier: DiskTier, memory: BytearraySlotMemory, keys: Sequence[bytes]) -> TierResult:
    for i, k in enumerate(keys):
        memory.slot_view(i)[:] = _fill(k)
    job = tier.submit_put(list(keys), list(range(len(keys))))
    assert tier.drain(10.0)
    (result,) = [r for r in tier.poll() if r.job_id == job]
    return result


def _get(tier: DiskTier, memory: BytearraySlotMemory, k: bytes) -> bytes | None:
    job = tier.submit_get([k], [0])
    assert tier.drain(10.0)
    (result,) = [r for r in tier.poll() if r.job_id == job]
    return bytes(memory.slot_view(0)) if result.all_ok else None


def test_after_enospc_at_fresh_slots_the_tier_evicts_and_keeps_storing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = BytearraySlotMemory(SLOT, 8)
    files = FullDisk()
    tier = DiskTier(memory, tmp_path, 16 * RECORD, files=files)
    assert _put(tier, memory, [conformance_key(i) for i in range(8)]).all_ok
    files.full = True
    caplog.set_level(logging.WARNING, logger="kvoffload.tiers.disk.tier")
    failed = _put(tier, memory, [conformance_key(i) for i in range(8, 16)])  # fresh slots
    assert failed.reasons == dict.fromkeys(range(8), "no_space")
    time.sleep(0.3)  # past the free-space reading's refresh, whatever the tier does
    later = [_put(tier, memory, [conformance_key(i)]) for i in range(100, 140)]
    assert sum(r.all_ok for r in later) == 40
    stats = tier.stats()
    assert stats["records"] == 8 and stats["evictions"] >= 40
    assert stats["dropped_no_space"] == 8
    k = conformance_key(139)
    assert _get(tier, memory, k) == _fill(k)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no_space" in warnings[0].getMessage()
    assert str(tier.directory) in warnings[0].getMessage()
    files.full = False  # space comes back: the tier grows again
    time.sleep(0.3)
    assert _put(tier, memory, [conformance_key(i) for i in range(200, 208)]).all_ok
    assert tier.stats()["records"] == 16
    tier.close()


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs (needs the right to mount; skipped with the reason otherwise)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        # lazy: a tier a failed assertion left open must not keep the mount behind
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def test_a_tmpfs_filled_by_another_program_mid_run_makes_the_tier_evict(
    small_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory = BytearraySlotMemory(SLOT, 4)
    tier = DiskTier(memory, small_tmpfs / "tier", 200 * RECORD)  # budget over the 4 MiB
    assert all(_put(tier, memory, [conformance_key(i)]).all_ok for i in range(40))
    # another program fills the filesystem to the last byte
    dd = subprocess.run(
        ["dd", "if=/dev/zero", f"of={small_tmpfs / 'filler'}", "bs=64k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dd.returncode != 0 and "No space left" in dd.stderr
    caplog.set_level(logging.WARNING, logger="kvoffload.tiers.disk.tier")
    results = [_put(tier, memory, [conformance_key(i)]).all_ok for i in range(1000, 1300)]
    # at most the puts before the tier saw the full disk fail; then every put is stored
    first_ok = results.index(True)
    assert all(results[first_ok:]), results
    stats = tier.stats()
    assert stats["evictions"] >= 300 - first_ok and stats["records"] <= 40
    k = conformance_key(1299)
    assert _get(tier, memory, k) == _fill(k)
    if first_ok:
        assert any("no_space" in r.getMessage() for r in caplog.records)
    tier.close()
