"""Byte-exact store/load round trips through the workers (CPU, and CUDA where available) for
every layout, dtype and chunk size; on CUDA also both copy modes and multi-batch staging."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import (  # noqa: E402
    DTYPES,
    SHAPES,
    block_bytes,
    expected_slot,
    make_caches,
    random_bytes,
    slot_bytes,
)

from kvoffload.layout import HostSlotLayout, KVCacheLayout, KVTensorLayout  # noqa: E402
from kvoffload.transfer.cuda_worker import COPY_MODES, CudaTransferWorker  # noqa: E402
from kvoffload.transfer.factory import create_transfer_worker  # noqa: E402
from kvoffload.transfer.host import HostBuffer  # noqa: E402
from kvoffload.transfer.worker import TransferWorker  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _store_load_roundtrip(
    kind: str,
    dtype: torch.dtype,
    bpc: int,
    device: str,
    seed: int,
    make_worker: Callable[..., TransferWorker] = create_transfer_worker,
    whole_chunks: bool = False,
) -> None:
    rng = random.Random(seed)
    num_blocks = 24
    caches = make_caches(kind, dtype, blocks=num_blocks, device=device, seed=seed)
    original = [c.clone() for c in caches]
    layout = KVCacheLayout.from_tensors(caches, kind)
    slots = layout.slot_layout(bpc)
    num_slots = 10
    host = HostBuffer(slots.slot_bytes, num_slots, pin=None if device == "cuda" else False)
    sentinel = torch.full_like(host.tensor, 0xA5)
    host.tensor.copy_(sentinel)
    worker = make_worker(layout, slots, host, caches)
    try:
        n = 4
        chunk_slots = rng.sample(range(num_slots), n)
        blocks = rng.sample(range(num_blocks), n * bpc)
        if whole_chunks:  # each chunk consecutive blocks; chunks 0 and 1 adjacent both sides
            chunk_slots = [3, 4, 8, 0]
            blocks = [b for first in (bpc, 2 * bpc, 4 * bpc, 0) for b in range(first, first + bpc)]
        worker.submit_store(1, blocks, chunk_slots)
        worker.wait([1])
        [result] = worker.get_finished()
        assert (result.job_id, result.success, result.kind) == (1, True, "store")
        assert result.bytes == n * slots.chunk_bytes(0)
        for i, s in enumerate(chunk_slots):
            want = expected_slot(layout, slots, caches, 0, blocks[i * bpc : (i + 1) * bpc])
            assert slot_bytes(host, s, len(want)) == want
        untouched = [s for s in range(num_slots) if s not in chunk_slots]
        assert torch.equal(host.tensor[untouched], sentinel[untouched])

        # Load into other random device blocks after scribbling over the whole cache.
        for c in caches:
            c.copy_(
                random_bytes(tuple(c.shape), c.dtype, torch.Generator().manual_seed(99)).to(device)
            )
        scribbled = [c.clone() for c in caches]
        targets = rng.sample(range(num_blocks), n * bpc)
        if whole_chunks:
            targets = [b for first in (0, bpc, 5 * bpc, 3 * bpc) for b in range(first, first + bpc)]
        worker.submit_load(2, chunk_slots, targets)
        worker.wait([2])
        [result] = worker.get_finished()
        assert result.success and result.kind == "load"
        for t in range(len(caches)):
            for view in range(layout.tensors[t].num_views):
                for src, dst in zip(blocks, targets, strict=True):
                    assert block_bytes(layout, caches, t, view, dst) == block_bytes(
                        layout, original, t, view, src
                    )
                for b in set(range(num_blocks)) - set(targets):
                    assert block_bytes(layout, caches, t, view, b) == block_bytes(
                        layout, scribbled, t, view, b
                    )
    finally:
        worker.shutdown()


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest.mark.parametrize("bpc", [2, 4])
def test_whole_chunk_runs_are_byte_exact(kind: str, bpc: int) -> None:
    """Chunks of consecutive device blocks move as one copy per chunk (runs of adjacent
    chunks as one): same bytes as the per-block path."""
    from kvoffload.transfer.cpu_worker import chunk_starts

    assert chunk_starts([4, 5, 0, 1], 2) == [4, 0]
    assert chunk_starts([4, 6, 0, 1], 2) is None  # a chunk with a gap: per-block path
    assert chunk_starts([0, 1, 0, 1], 2) is None  # a repeated block: per-block path
    _store_load_roundtrip(kind, torch.float16, bpc, "cpu", seed=bpc, whole_chunks=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_roundtrip_is_byte_exact(kind: str, dtype: torch.dtype, bpc: int, device: str) -> None:
    _store_load_roundtrip(kind, dtype, bpc, device, seed=hash((kind, str(dtype), bpc)) % 1000)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", COPY_MODES)
@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_cuda_copy_modes_and_one_slot_staging_batches_are_byte_exact(
    kind: str, bpc: int, mode: str
) -> None:
    """Staging of one slot makes a 4-chunk job run as 4 batches reusing one buffer in order."""

    def make(
        layout: KVCacheLayout, slots: HostSlotLayout, host: HostBuffer, caches: Sequence[object]
    ) -> TransferWorker:
        return CudaTransferWorker(
            layout, slots, host, caches, staging_bytes=slots.slot_bytes, copy_mode=mode
        )

    _store_load_roundtrip(kind, torch.bfloat16, bpc, "cuda", seed=bpc, make_worker=make)


def test_copy_mode_is_checked() -> None:
    caches = make_caches("mla", torch.float16, blocks=4)
    layout = KVCacheLayout.from_tensors(caches, "mla")
    slots = layout.slot_layout(1)
    host = HostBuffer(slots.slot_bytes, 2, pin=False)
    with pytest.raises(ValueError, match="copy_mode must be one of"):
        CudaTransferWorker(layout, slots, host, caches, copy_mode="per_block")


@pytest.mark.parametrize("device", DEVICES)
def test_several_groups_and_odd_page_sizes(device: str) -> None:
    """Group 1 has two tensors, group 0 one (its slots are padded); pages of 3 bytes."""
    gen = torch.Generator().manual_seed(5)
    caches = {
        "g0": random_bytes((12, 3, 1), torch.uint8, gen).to(device),
        "g1a": random_bytes((2, 12, 3, 1, 1), torch.uint8, gen).to(device),
        "g1b": random_bytes((12, 3, 1), torch.uint8, gen).to(device),
    }
    layout = KVCacheLayout(
        [
            KVTensorLayout("g0", "mla", (12, 3, 1), "uint8", group=0),
            KVTensorLayout("g1a", "kv_first", (2, 12, 3, 1, 1), "uint8", group=1),
            KVTensorLayout("g1b", "mla", (12, 3, 1), "uint8", group=1),
        ]
    )
    slots = layout.slot_layout(2)
    assert slots.word_size == 1 and slots.chunk_bytes(0) < slots.slot_bytes
    host = HostBuffer(slots.slot_bytes, 6, pin=None if device == "cuda" else False)
    tensors = [caches[t.name] for t in layout.tensors]
    worker = create_transfer_worker(layout, slots, host, caches)
    try:
        worker.submit_store(7, [5, 1, 2, 3, 8, 0], [4, 0, 2], group_ids=[1, 0, 1])
        worker.wait([7])
        assert [r.success for r in worker.get_finished()] == [True]
        for s, group, blocks in ((4, 1, [5, 1]), (0, 0, [2, 3]), (2, 1, [8, 0])):
            want = expected_slot(layout, slots, tensors, group, blocks)
            assert slot_bytes(host, s, len(want)) == want
        before = {name: t.clone() for name, t in caches.items()}
        worker.submit_load(8, [0, 4], [10, 11, 6, 7], group_ids=[0, 1])
        worker.wait([8])
        assert [r.success for r in worker.get_finished()] == [True]
        assert torch.equal(caches["g0"][[10, 11]], before["g0"][[2, 3]])
        assert torch.equal(caches["g1a"][:, [6, 7]], before["g1a"][:, [5, 1]])
        assert torch.equal(caches["g1b"][[6, 7]], before["g1b"][[5, 1]])
        # Group 1's load did not touch group 0's blocks 6, 7, nor group 1's 10, 11.
        assert torch.equal(caches["g0"][[6, 7]], before["g0"][[6, 7]])
        assert torch.equal(caches["g1b"][[10, 11]], before["g1b"][[10, 11]])
    finally:
        worker.shutdown()


@pytest.mark.parametrize("device", DEVICES)
def test_consecutive_runs_and_large_pages_are_split_correctly(device: str) -> None:
    """Fresh-cache mappings (runs: one DMA each on CUDA) and pages above torch's parallel grain
    take other paths."""
    gen = torch.Generator().manual_seed(3)
    caches = [
        random_bytes((2, 16, 64, 8, 128), torch.float16, gen).to(device) for _ in range(2)
    ]  # 128 KiB pages
    layout = KVCacheLayout.from_tensors(caches)
    slots = layout.slot_layout(2)
    host = HostBuffer(slots.slot_bytes, 8, pin=None if device == "cuda" else False)
    worker = create_transfer_worker(layout, slots, host, caches)
    try:
        blocks = list(range(2, 14))  # six chunks, consecutive blocks and slots: merged runs
        worker.submit_store(1, blocks, [1, 2, 3, 4, 5, 6])
        worker.wait([1])
        assert worker.get_finished()[0].success
        for i, s in enumerate(range(1, 7)):
            want = expected_slot(layout, slots, caches, 0, blocks[2 * i : 2 * i + 2])
            assert slot_bytes(host, s, len(want)) == want
        before = [c.clone() for c in caches]
        worker.submit_load(2, [6, 5, 4], [0, 1, 14, 15, 2, 3])
        worker.wait([2])
        assert worker.get_finished()[0].success
        for c, b in zip(caches, before, strict=True):  # compare bits: random halves hold NaNs
            c16, b16 = c.view(torch.int16), b.view(torch.int16)
            assert torch.equal(c16[:, [0, 1, 14, 15, 2, 3]], b16[:, [12, 13, 10, 11, 8, 9]])
            assert torch.equal(c16[:, 4:14], b16[:, 4:14])
    finally:
        worker.shutdown()
