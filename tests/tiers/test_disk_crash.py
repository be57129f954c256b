"""Crash safety: a child writing blocks is SIGKILLed at random points; a fresh tier recovers.

After each kill, every block whose store the child saw complete must come back byte for byte,
and no block may be served with other bytes than were stored (torn records are never data).
"""

from __future__ import annotations

import os
import random
import select
import signal
import sys
import time
from pathlib import Path

import pytest

from kvoffload.testing.tiers import conformance_key
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.disk import HEADER_BYTES, DiskTier

SLOT = 96 * 1024
RECORDS = 64  # the child writes more than this, so evictions happen mid-run too
RUNS = 24
MAX_BATCH = 3  # the child's batches are 1 to 3 keys


def _block(i: int) -> bytes:
    return random.Random(i).randbytes(SLOT)


def _index(key: bytes) -> int:
    return int.from_bytes(key[9:17], "big")


def _child(path: str, durability: str, first: int, wfd: int) -> None:
    """Store blocks first, first+1, ... in batches; report each completed key on the pipe."""
    memory = BytearraySlotMemory(SLOT, 4)
    tier = DiskTier(memory, path, RECORDS * (HEADER_BYTES + SLOT), durability=durability)
    os.write(wfd, b"R\n")
    i = first
    while True:
        batch = list(range(i, i + 1 + i % 3))
        i += len(batch)
        for slot, k in enumerate(batch):
            memory.slot_view(slot)[:] = _block(k)
        tier.submit_put([conformance_key(k) for k in batch], list(range(len(batch))))
        tier.drain(10.0)
        for result in tier.poll():
            # evictions first: a block evicted by this very job must not count as kept
            lines = [f"E{_index(key)}\n" for key in result.evicted]
            lines += [
                f"{_index(key)}\n" for key, ok in zip(result.keys, result.ok, strict=True) if ok
            ]
            if lines:
                os.write(wfd, "".join(lines).encode())


def _read_all(rfd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_at_random_points_loses_no_completed_block_and_serves_no_torn_one(
    tmp_path: Path,
) -> None:
    rng = random.Random(2024)
    completed: set[int] = set()
    next_first = 0
    torn = 0
    for run in range(RUNS):
        durability = ("rename", "fsync", "none")[run % 3]
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                os.close(rfd)
                _child(str(tmp_path), durability, next_first, wfd)
            finally:
                os._exit(0)
        os.close(wfd)
        ready, _, _ = select.select([rfd], [], [], 20.0)
        started = bool(ready) and os.read(rfd, 2) == b"R\n"
        if not started:  # never leave the child behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            pytest.fail(f"run {run}: the child did not start")
        time.sleep(rng.uniform(0.002, 0.08))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        lines = _read_all(rfd).split()
        reported = {int(line) for line in lines if not line.startswith(b"E")}
        evicted = {int(line[1:]) for line in lines if line.startswith(b"E")}
        os.close(rfd)
        next_first += 10_000
        # a fresh tier (durability does not matter for reading) recovers from the directory
        memory = BytearraySlotMemory(SLOT, 1)
        tier = DiskTier(memory, tmp_path, RECORDS * (HEADER_BYTES + SLOT))
        torn += int(tier.stats()["torn_records"])
        present = {_index(b.key) for b in tier.scan()}
        # every completed block the child did not evict itself (its budget is RECORDS) is
        # back, except that the put in flight at the kill (at most 3 keys, never reported) may
        # already have evicted as many of the oldest records to make room for itself
        survivors = sorted(reported - evicted)
        missing = [k for k in survivors if k not in present]
        oldest = set(survivors[: 2 * MAX_BATCH])
        assert len(missing) <= MAX_BATCH and set(missing) <= oldest, (
            f"run {run} ({durability}): completed blocks lost: {missing[:5]}"
        )
        for k in sorted(present):
            job = tier.submit_get([conformance_key(k)], [0])
            assert tier.drain(10.0)
            (result,) = tier.poll()
            assert result.job_id == job
            if k in reported:
                assert result.all_ok, f"run {run}: completed block {k} not served: {result}"
            if result.all_ok:
                assert bytes(memory.slot_view(0)) == _block(k), f"run {run}: block {k} differs"
        completed |= reported
        tier.close()
    assert len(completed) > RUNS, "the child completed too few stores for the test to mean much"
    print(
        f"{len(completed)} completed blocks over {RUNS} kills, {torn} torn records erased",
        file=sys.stderr,
    )
