"""KVOffloader over configured tiers: real blocks CPU -> disk -> CPU -> device, byte-exact."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.keys import hash_token_blocks  # noqa: E402
from kvoffload.offloader import KVOffloader  # noqa: E402
from kvoffload.tiers.manager import TieringManager  # noqa: E402

TOKENS = 4  # tokens per device block in make_caches
PER_SLOT = 2 * 2 * TOKENS * 2 * 4 * 2  # layers * (K, V) * tokens * heads * head_size * fp16


def _offloader(root: Path, slots: int, seed: int = 3) -> tuple[KVOffloader, list[torch.Tensor]]:
    caches = make_caches("kv_first", torch.float16, layers=2, blocks=32, seed=seed)
    tiers = [{"type": "disk", "path": str(root), "capacity_bytes": "1MiB"}]
    return KVOffloader(caches, cpu_bytes=slots * PER_SLOT, tiers=tiers), caches


def _hashes(n: int) -> list[bytes]:
    return hash_token_blocks(list(range(n * TOKENS)), TOKENS)


def test_blocks_evicted_from_the_cpu_come_back_from_disk_byte_exact(tmp_path: Path) -> None:
    off, caches = _offloader(tmp_path, slots=4)
    reference = [c.clone() for c in caches]
    hashes = _hashes(12)
    assert isinstance(off.manager, TieringManager)
    for start in range(0, 12, 4):  # four at a time, so every block lands in the CPU, then disk
        off.store(hashes[start : start + 4], list(range(start, start + 4)))
        off.flush()
    disk = off.stats().manager.tiers["disk"]  # type: ignore[union-attr]
    assert disk["blocks_written"] == 12
    for c in caches:
        c.zero_()
    assert off.lookup(hashes[:4]) == 4  # evicted from the CPU long ago: promoted from disk
    assert off.load(hashes[:4], [20, 21, 22, 23]) == 4
    for c, ref in zip(caches, reference, strict=True):
        assert torch.equal(c[:, 20:24].view(torch.int16), ref[:, 0:4].view(torch.int16))
    disk = off.stats().manager.tiers["disk"]  # type: ignore[union-attr]
    assert disk["promotions"] == 4 and disk["bytes_read"] == 4 * PER_SLOT
    off.close()


def test_a_new_offloader_starts_warm_from_the_disk_of_the_last(tmp_path: Path) -> None:
    hashes = _hashes(6)
    first, caches = _offloader(tmp_path, slots=8)
    reference = [c.clone() for c in caches]
    first.store(hashes, list(range(6)))
    first.close()  # drains the write-through puts
    second, fresh = _offloader(tmp_path, slots=8, seed=99)
    assert second.lookup(hashes) == 6
    second.load(hashes, list(range(10, 16)))
    for c, ref in zip(fresh, reference, strict=True):
        assert torch.equal(c[:, 10:16].view(torch.int16), ref[:, 0:6].view(torch.int16))
    stats = second.stats()
    assert stats.manager.tiers["disk"]["promotions"] == 6  # type: ignore[union-attr]
    second.close()


def test_lookup_stops_at_the_first_block_found_nowhere(tmp_path: Path) -> None:
    off, _ = _offloader(tmp_path, slots=8)
    hashes = _hashes(6)
    off.store(hashes[:3], [0, 1, 2])
    off.flush()
    off.reset()  # the CPU forgets; the disk keeps them
    assert off.lookup(hashes) == 3
    off.close()
