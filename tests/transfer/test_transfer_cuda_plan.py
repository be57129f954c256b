"""The CUDA worker's copy plan (gather to staging, DMA per slot run, scatter), run on CPU tensors.

No GPU is needed: the plan's indexing, batching and slot-run arithmetic are plain tensor ops, so
they are executed here with CPU tensors standing in for device memory (the index upload, the
only CUDA-specific call, is replaced). Streams, events and page-locking are covered by the
CUDA-only tests, which run where CUDA is available.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import SHAPES, block_bytes, expected_slot, make_caches, slot_bytes  # noqa: E402

from kvoffload.layout import KVCacheLayout, KVTensorLayout  # noqa: E402
from kvoffload.transfer.cuda_worker import CudaTransferWorker, slot_runs  # noqa: E402
from kvoffload.transfer.host import HostBuffer  # noqa: E402
from kvoffload.transfer.views import word_dtype  # noqa: E402
from kvoffload.transfer.worker import TransferPart, TransferWorker  # noqa: E402


def _plan(
    layout: KVCacheLayout, caches: object, host: HostBuffer, batch: int, bpc: int = 1
) -> CudaTransferWorker:
    """A CudaTransferWorker whose copy plan runs on CPU tensors (no streams are created)."""
    slots = layout.slot_layout(bpc)
    worker = CudaTransferWorker.__new__(CudaTransferWorker)
    TransferWorker.__init__(worker, layout, slots, host, caches)  # type: ignore[arg-type]
    words = slots.slot_bytes // slots.word_size
    worker._batch_slots = batch
    worker._store_stage = torch.empty((batch, words), dtype=word_dtype(slots.word_size))
    worker._load_stage = torch.empty_like(worker._store_stage)
    worker._index = lambda ids: torch.tensor(ids, dtype=torch.int64)  # type: ignore[method-assign]
    return worker


def test_slot_runs() -> None:
    assert list(slot_runs([4, 5, 6, 2, 3, 9, 9])) == [(0, 3, 4), (3, 5, 2), (5, 6, 9), (6, 7, 9)]
    assert list(slot_runs([])) == []


@pytest.mark.parametrize("bpc", [1, 2, 4])
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_store_and_load_plans_are_byte_exact(kind: str, bpc: int) -> None:
    rng = random.Random(bpc)
    caches = make_caches(kind, torch.bfloat16, blocks=32, seed=bpc)
    original = [c.clone() for c in caches]
    layout = KVCacheLayout.from_tensors(caches, kind)
    slots = layout.slot_layout(bpc)
    host = HostBuffer(slots.slot_bytes, 8, pin=False)
    worker = _plan(layout, caches, host, batch=3, bpc=bpc)  # 5 chunks: batches of 3 + 2
    chunk_slots = [6, 7, 0, 3, 2]  # runs (6, 7), (0), (3), (2)
    blocks = rng.sample(range(32), 5 * bpc)
    worker._store_part(TransferPart(0, chunk_slots, blocks))
    for i, s in enumerate(chunk_slots):
        want = expected_slot(layout, slots, original, 0, blocks[i * bpc : (i + 1) * bpc])
        assert slot_bytes(host, s, len(want)) == want

    targets = rng.sample(range(32), 5 * bpc)
    for c in caches:
        c.view(torch.int16).fill_(0)
    worker._load_part(TransferPart(0, chunk_slots, targets))
    for t in range(len(caches)):
        for view in range(layout.tensors[t].num_views):
            for src, dst in zip(blocks, targets, strict=True):
                assert block_bytes(layout, caches, t, view, dst) == block_bytes(
                    layout, original, t, view, src
                )


@pytest.mark.parametrize("bpc", [1, 2])
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_direct_copy_mode_is_byte_exact(kind: str, bpc: int) -> None:
    """The per-page baseline the benchmark compares against moves the same bytes."""
    rng = random.Random(10 + bpc)
    caches = make_caches(kind, torch.float16, blocks=16, seed=bpc)
    original = [c.clone() for c in caches]
    layout = KVCacheLayout.from_tensors(caches, kind)
    slots = layout.slot_layout(bpc)
    host = HostBuffer(slots.slot_bytes, 6, pin=False)
    worker = _plan(layout, caches, host, batch=1, bpc=bpc)
    chunk_slots = [5, 0, 3]
    blocks = rng.sample(range(16), 3 * bpc)
    worker._direct_part(TransferPart(0, chunk_slots, blocks), to_host=True)
    for i, s in enumerate(chunk_slots):
        want = expected_slot(layout, slots, original, 0, blocks[i * bpc : (i + 1) * bpc])
        assert slot_bytes(host, s, len(want)) == want
    targets = rng.sample(range(16), 3 * bpc)
    for c in caches:
        c.view(torch.int16).fill_(0)
    worker._direct_part(TransferPart(0, chunk_slots, targets), to_host=False)
    for t in range(len(caches)):
        for view in range(layout.tensors[t].num_views):
            for src, dst in zip(blocks, targets, strict=True):
                assert block_bytes(layout, caches, t, view, dst) == block_bytes(
                    layout, original, t, view, src
                )


def test_padded_slots_move_only_the_group_chunk() -> None:
    gen = torch.Generator().manual_seed(2)
    small = torch.randint(0, 256, (10, 4, 2), dtype=torch.uint8, generator=gen)
    big = [torch.randint(0, 256, (10, 4, 2), dtype=torch.uint8, generator=gen) for _ in range(2)]
    layout = KVCacheLayout(
        [
            KVTensorLayout("s", "mla", (10, 4, 2), "uint8", group=0),
            KVTensorLayout("b0", "mla", (10, 4, 2), "uint8", group=1),
            KVTensorLayout("b1", "mla", (10, 4, 2), "uint8", group=1),
        ]
    )
    tensors = [small, *big]
    slots = layout.slot_layout(1)
    host = HostBuffer(slots.slot_bytes, 4, pin=False)
    host.tensor.fill_(0xEE)
    worker = _plan(layout, tensors, host, batch=4)
    worker._store_part(TransferPart(0, [1, 2], [3, 4]))  # group 0 fills half a slot
    chunk = slots.chunk_bytes(0)
    for s, b in ((1, 3), (2, 4)):
        assert slot_bytes(host, s, chunk) == expected_slot(layout, slots, tensors, 0, [b])
        assert host.slot(s)[chunk:].eq(0xEE).all()  # the padding was not written
