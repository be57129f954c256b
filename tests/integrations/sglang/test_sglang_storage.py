"""Our tiers as SGLang's HiCache L3 backend, built by SGLang's own ``StorageBackendFactory``.

Needs SGLang (``.ci/sglang`` builds an environment with it); skipped without. Each backend is
made the way SGLang's cache controller makes it: ``create_backend("dynamic", config,
host_pool)`` then ``register_mem_pool_host(host_pool)``, and driven with the calls its prefetch
and backup threads make. The host pool is SGLang's ``MHATokenToKVPoolHost`` where its module
imports (it needs torchvision, which has no CPU build for torch 2.13 on PyPI); otherwise
:class:`PageFirstHostPool` below, which lays out and cuts pages as SGLang's does (its
``get_page_buffer_meta``, ``get_data_page`` and ``set_from_flat_data_page`` for the
``page_first`` and ``layer_first`` layouts).
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory")

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from kvoffload.integrations.sglang import KVOffloadStorage
from kvoffload.tiers.disk import HEADER_BYTES

sys.path.insert(0, str(Path(__file__).parents[2] / "tiers"))
from redis_servers import ci_url

LAYERS, HEADS, DIM, PAGE = 2, 2, 8, 4
TOKENS = 64  # host pool capacity: 16 pages
MODULE = "kvoffload.integrations.sglang"


class PageFirstHostPool:
    """SGLang's MHA host pool geometry (``kv_buffer`` of shape (2, tokens, layers, heads,
    dim) for ``page_first``, (2, layers, tokens, heads, dim) for ``layer_first``) with the
    methods a storage backend calls, byte for byte as SGLang 0.5.23 defines them."""

    def __init__(self, layout: str = "page_first", dtype: torch.dtype = torch.bfloat16) -> None:
        self.layout, self.dtype, self.page_size, self.size = layout, dtype, PAGE, TOKENS
        self.layer_num, self.head_num, self.head_dim = LAYERS, HEADS, DIM
        dims = (
            (2, TOKENS, LAYERS, HEADS, DIM)
            if layout == "page_first"
            else (2, LAYERS, TOKENS, HEADS, DIM)
        )
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple[list[int], list[int]]:
        item = self.dtype.itemsize
        base = self.kv_buffer.data_ptr()
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        ptrs: list[int] = []
        idx = indices.tolist()
        if self.layout == "page_first":
            for i in range(0, len(idx), self.page_size):
                k = base + idx[i] * self.layer_num * self.head_num * self.head_dim * item
                ptrs += [k, k + v_offset]
            size = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        else:
            for i in range(0, len(idx), self.page_size):
                for layer in range(self.layer_num):
                    k = base + (idx[i] + layer * self.size) * self.head_num * self.head_dim * item
                    ptrs += [k, k + v_offset]
            size = item * self.page_size * self.head_num * self.head_dim
        return ptrs, [size] * len(ptrs)

    def _page(self, index: int) -> torch.Tensor:
        if self.layout == "page_first":
            return self.kv_buffer[:, index : index + self.page_size]
        return self.kv_buffer[:, :, index : index + self.page_size]

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self._page(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(2 * LAYERS * PAGE * HEADS * DIM, dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self._page(index)[...] = data_page.reshape(self._page(index).shape)


def sglang_host_pool(layout: str) -> Any:
    """SGLang's own MHA host pool where its module imports, else the faithful local one."""
    try:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    except (ImportError, RuntimeError):
        return PageFirstHostPool(layout)
    device = MHATokenToKVPool(
        TOKENS, PAGE, torch.bfloat16, HEADS, DIM, LAYERS, "cpu", False, 0, LAYERS
    )
    return MHATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info,
        2,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device_capacity_tokens=device.size,
        start_layer=device.start_layer,
        end_layer=device.end_layer,
    )


def storage_config(
    tier: dict[str, Any],
    *,
    v1: bool = True,
    tp_rank: int = 0,
    tp_size: int = 1,
    mla: bool = False,
    model: str = "test/model",
    **extra: Any,
) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=True,
        is_page_first_layout=True,
        model_name=model,
        extra_config={
            "backend_name": "kvoffload",
            "module_path": MODULE,
            "class_name": "KVOffloadStorage",
            "interface_v1": 1 if v1 else 0,
            "tier": tier,
            **extra,
        },
    )


def build(config: HiCacheStorageConfig, pool: Any) -> Any:
    """What SGLang's cache controller does in attach_storage_backend."""
    backend = StorageBackendFactory.create_backend("dynamic", config, pool)
    backend.register_mem_pool_host(pool)
    backend.on_host_pools_registered()
    return backend


def disk(path: Path, capacity: int = 1 << 22, **extra: Any) -> dict[str, Any]:
    return {"type": "disk", "path": str(path), "capacity_bytes": capacity, "io_threads": 1, **extra}


def fill(pool: Any, page: int, seed: int) -> torch.Tensor:
    """Random bytes into host page ``page``; returns a copy of the page's bytes."""
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(
        0, 256, (pool.get_dummy_flat_data_page().numel() * 2,), generator=gen, dtype=torch.uint8
    ).view(torch.bfloat16)
    pool.set_from_flat_data_page(page * PAGE, data)
    return pool.get_data_page(page * PAGE).clone()


def indices(pages: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])


def keys(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"{tag}{i:056x}" for i in range(n)]  # SGLang's page keys are sha256 hex digests


@pytest.fixture()
def closing() -> Iterator[list[Any]]:
    backends: list[Any] = []
    yield backends
    for backend in backends:
        backend.close()


def test_the_factory_builds_ours_from_a_dynamic_config(tmp_path: Path, closing: list[Any]) -> None:
    pool = sglang_host_pool("page_first")
    backend = build(storage_config(disk(tmp_path)), pool)
    closing.append(backend)
    assert isinstance(backend, KVOffloadStorage)
    assert backend.geometry.zero_copy and backend.geometry.pieces == 2  # K and V of a page
    with pytest.raises(ValueError, match="unknown extra-config key 'teir'; did you mean 'tier'"):
        StorageBackendFactory.create_backend(
            "dynamic", storage_config(disk(tmp_path), teir={}), pool
        )


@pytest.mark.parametrize("v1", [True, False], ids=["zero-copy v1", "copying batch_get/set"])
def test_round_trip_is_byte_exact(tmp_path: Path, closing: list[Any], v1: bool) -> None:
    pool = sglang_host_pool("page_first")
    backend = build(storage_config(disk(tmp_path), v1=v1), pool)
    closing.append(backend)
    names = keys(5)
    pages = [3, 7, 1, 12, 5]
    originals = [fill(pool, p, seed=i) for i, p in enumerate(pages)]
    assert backend.batch_exists(names) == 0
    if v1:
        assert backend.batch_set_v1(names, indices(pages), HiCacheStorageExtraInfo()) == [True] * 5
    else:
        assert backend.batch_set(names, [pool.get_data_page(p * PAGE) for p in pages])
    assert backend.batch_exists(names) == 5
    assert backend.batch_exists([*names[:2], "00" * 32, *names[2:]]) == 2  # prefix semantics
    pool.kv_buffer.zero_()
    targets = [9, 2, 14, 0, 11]
    if v1:
        assert backend.batch_get_v1(names, indices(targets)) == [True] * 5
        got = [pool.get_data_page(t * PAGE) for t in targets]
    else:
        got = backend.batch_get(names, [pool.get_dummy_flat_data_page() for _ in names])
    for original, page in zip(originals, got, strict=True):
        assert page is not None and torch.equal(page.view(torch.uint8), original.view(torch.uint8))
    stats = backend.get_stats()  # SGLang's StorageMetrics: pages per batch and GB/s
    assert stats.backup_pgs == [5] and stats.prefetch_pgs == [5]
    assert backend.get_stats().prefetch_pgs == []  # reported once


def test_zero_copy_and_copying_calls_store_the_same_records(
    tmp_path: Path, closing: list[Any]
) -> None:
    pool = sglang_host_pool("page_first")
    writer = build(storage_config(disk(tmp_path), v1=False), pool)
    closing.append(writer)
    names = keys(3)
    originals = [fill(pool, p, seed=10 + p) for p in range(3)]
    assert writer.batch_set(names, [pool.get_data_page(p * PAGE) for p in range(3)])
    pool.kv_buffer.zero_()
    assert writer.batch_get_v1(names, indices([4, 5, 6])) == [True] * 3
    for original, page in zip(originals, (4, 5, 6), strict=True):
        assert torch.equal(
            pool.get_data_page(page * PAGE).view(torch.uint8), original.view(torch.uint8)
        )


def test_layer_first_pages_are_copied_and_v1_is_refused_with_the_reason(
    tmp_path: Path, closing: list[Any]
) -> None:
    pool = sglang_host_pool("layer_first")
    with pytest.raises(ValueError, match="interface_v1 needs page-contiguous host pages"):
        build(storage_config(disk(tmp_path / "a")), pool)
    backend = build(storage_config(disk(tmp_path / "b"), v1=False), pool)
    closing.append(backend)
    assert not backend.geometry.zero_copy and backend.geometry.pieces == 1
    names = keys(2)
    originals = [fill(pool, p, seed=p) for p in (0, 1)]
    assert backend.batch_set(names, [pool.get_data_page(p * PAGE) for p in (0, 1)])
    got = backend.batch_get(names, [pool.get_dummy_flat_data_page() for _ in names])
    for page, original in zip(got, originals, strict=True):
        assert page is not None and torch.equal(page.view(torch.uint8), original.view(torch.uint8))


def test_a_restarted_disk_tier_is_warm(tmp_path: Path, closing: list[Any]) -> None:
    pool = sglang_host_pool("page_first")
    first = build(storage_config(disk(tmp_path)), pool)
    names = keys(4)
    originals = [fill(pool, p, seed=20 + p) for p in range(4)]
    assert first.batch_set_v1(names, indices([0, 1, 2, 3])) == [True] * 4
    first.close()
    again = build(storage_config(disk(tmp_path)), sglang_host_pool("page_first"))
    closing.append(again)
    assert again.batch_exists(names) == 4  # found by the start-up scan, no new writes
    assert again.tier_stats()["scanned_records"] == 8
    assert again.batch_get_v1(names, indices([8, 9, 10, 11])) == [True] * 4
    for original, page in zip(originals, (8, 9, 10, 11), strict=True):
        assert torch.equal(
            again.mem_pool_host.get_data_page(page * PAGE).view(torch.uint8),
            original.view(torch.uint8),
        )
    other = build(
        storage_config(disk(tmp_path), model="other/model"), sglang_host_pool("page_first")
    )
    closing.append(other)
    assert other.batch_exists(names) == 0  # another model's namespace never sees them
    rank1 = build(
        storage_config(disk(tmp_path), tp_rank=1, tp_size=2), sglang_host_pool("page_first")
    )
    closing.append(rank1)
    assert rank1.batch_exists(names) == 0  # an MHA page is one TP rank's shard


def test_a_corrupt_record_is_a_miss_never_data(tmp_path: Path, closing: list[Any]) -> None:
    pool = sglang_host_pool("page_first")
    backend = build(storage_config(disk(tmp_path)), pool)
    closing.append(backend)
    names = keys(2)
    fill(pool, 0, seed=1)
    original = fill(pool, 1, seed=2)
    assert backend.batch_set_v1(names, indices([0, 1])) == [True, True]
    arena = backend.tier.arena_path
    piece = backend.geometry.piece_bytes
    with open(arena, "r+b") as f:  # flip one payload byte of the first record (page 0's K)
        f.seek(HEADER_BYTES + piece // 2)
        byte = f.read(1)
        f.seek(HEADER_BYTES + piece // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    pool.kv_buffer.zero_()
    assert backend.batch_get_v1(names, indices([4, 5])) == [False, True]
    assert torch.equal(pool.get_data_page(5 * PAGE).view(torch.uint8), original.view(torch.uint8))
    assert backend.tier_stats()["corrupt_records"] >= 1
    assert backend.batch_exists(names) == 0  # erased: the page is a miss from now on
    assert backend.get(names[0], pool.get_dummy_flat_data_page()) is None


def test_a_failed_write_is_a_failed_page(tmp_path: Path, closing: list[Any]) -> None:
    pool = sglang_host_pool("page_first")
    record = HEADER_BYTES + 2 * LAYERS * PAGE * HEADS * DIM * 2 // 2
    backend = build(storage_config(disk(tmp_path, capacity=record)), pool)  # room for 1 record
    closing.append(backend)
    names = keys(1)
    fill(pool, 0, seed=3)
    assert backend.batch_set_v1(names, indices([0])) == [False]  # K and V cannot both fit
    assert backend.batch_exists(names) == 0


@pytest.fixture()
def redis_url() -> str:
    return ci_url("KVOFFLOAD_REDIS_URL")


def test_two_backends_on_one_redis_share_pages(redis_url: str, closing: list[Any]) -> None:
    tier = {"type": "redis", "url": redis_url, "lookup_deadline_ms": 5000.0}
    pool_a, pool_b = sglang_host_pool("page_first"), sglang_host_pool("page_first")
    a = build(storage_config(tier), pool_a)
    b = build(storage_config(tier), pool_b)
    closing.extend([a, b])
    names = keys(3)
    originals = [fill(pool_a, p, seed=30 + p) for p in range(3)]
    assert a.batch_set_v1(names, indices([0, 1, 2])) == [True] * 3
    assert b.batch_exists(names) == 3  # computed by a, found by b
    assert b.batch_get_v1(names, indices([13, 14, 15])) == [True] * 3
    for original, page in zip(originals, (13, 14, 15), strict=True):
        assert torch.equal(
            pool_b.get_data_page(page * PAGE).view(torch.uint8), original.view(torch.uint8)
        )
    mla_other_tp = build(
        storage_config(tier, mla=True, tp_rank=1, tp_size=4), sglang_host_pool("page_first")
    )
    closing.append(mla_other_tp)
    assert mla_other_tp.batch_exists(names) == 0  # MLA pages are a namespace of their own


def test_mla_pages_are_shared_across_tp_sizes(tmp_path: Path, closing: list[Any]) -> None:
    """An MLA pool's KV is whole on every rank: the namespace leaves the TP shard out."""
    tp2 = build(
        storage_config(disk(tmp_path), mla=True, tp_rank=0, tp_size=2),
        sglang_host_pool("page_first"),
    )
    names = keys(2)
    for p in range(2):
        fill(tp2.mem_pool_host, p, seed=40 + p)
    assert tp2.batch_set_v1(names, indices([0, 1])) == [True, True]
    tp2.close()
    tp4 = build(
        storage_config(disk(tmp_path), mla=True, tp_rank=3, tp_size=4),
        sglang_host_pool("page_first"),
    )
    closing.append(tp4)
    assert tp4.batch_exists(names) == 2


def test_a_target_that_is_not_contiguous_is_refused(tmp_path: Path, closing: list[Any]) -> None:
    """Bytes written into a copy of a strided target would be lost: an error, not a hit."""
    pool = sglang_host_pool("page_first")
    backend = build(storage_config(disk(tmp_path), v1=False), pool)
    closing.append(backend)
    names = keys(1)
    fill(pool, 0, seed=5)
    assert backend.batch_set(names, [pool.get_data_page(0)])
    strided = torch.zeros(2 * pool.get_dummy_flat_data_page().numel(), dtype=torch.bfloat16)[::2]
    with pytest.raises(ValueError, match="must be contiguous"):
        backend.batch_get(names, [strided])


def test_any_registered_tier_serves_including_one_registered_here(closing: list[Any]) -> None:
    """``tier.type`` resolves through kvoffload's tier registry: built-in or registered."""
    from kvoffload.tiers.memory import MemoryTier
    from kvoffload.tiers.registry import register_tier

    class CountingTier(MemoryTier):
        puts = 0

        def submit_put(self, keys: Any, slots: Any, generation: int = 0) -> int:
            type(self).puts += len(keys)
            return super().submit_put(keys, slots, generation)

    register_tier("counting-test", CountingTier)
    for name in ("memory", "counting-test"):
        pool = sglang_host_pool("page_first")
        backend = build(storage_config({"type": name, "capacity_bytes": 1 << 20}), pool)
        closing.append(backend)
        names = keys(2)
        originals = [fill(pool, p, seed=50 + p) for p in range(2)]
        assert backend.batch_set_v1(names, indices([0, 1])) == [True, True]
        pool.kv_buffer.zero_()
        assert backend.batch_get_v1(names, indices([2, 3])) == [True, True]
        for original, page in zip(originals, (2, 3), strict=True):
            got = pool.get_data_page(page * PAGE)
            assert torch.equal(got.view(torch.uint8), original.view(torch.uint8))
    assert CountingTier.puts == 4  # K and V of two pages


def test_clear_empties_the_disk_tiers_namespace(tmp_path: Path, closing: list[Any]) -> None:
    """SGLang's ``/flush_cache`` calls ``clear``: every record of the namespace goes."""
    pool = sglang_host_pool("page_first")
    backend = build(storage_config(disk(tmp_path)), pool)
    closing.append(backend)
    names = keys(3)
    for p in range(3):
        fill(pool, p, seed=60 + p)
    assert backend.batch_set_v1(names, indices([0, 1, 2])) == [True] * 3
    backend.clear()
    assert backend.batch_exists(names) == 0
    assert backend.tier_stats()["records"] == 0
