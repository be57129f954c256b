"""KV layouts and host slot maps: pure Python, no torch needed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvoffload.layout import (
    KVCacheLayout,
    KVTensorLayout,
    dtype_name,
    slots_for_budget,
)


@dataclass
class FakeTensor:
    """Anything with ``shape`` and ``dtype`` describes a tensor."""

    shape: tuple[int, ...]
    dtype: str


def test_kinds_report_blocks_tokens_and_page_bytes() -> None:
    kv_first = KVTensorLayout("a", "kv_first", (2, 10, 16, 4, 8), "float16")
    assert (kv_first.num_blocks, kv_first.block_size, kv_first.num_views) == (10, 16, 2)
    assert kv_first.page_bytes == 16 * 4 * 8 * 2
    assert kv_first.bytes_per_block == 2 * 16 * 4 * 8 * 2

    blocks_first = KVTensorLayout("b", "blocks_first", (10, 2, 16, 4, 8), "bfloat16")
    assert (blocks_first.num_blocks, blocks_first.block_size, blocks_first.num_views) == (
        10,
        16,
        1,
    )
    assert blocks_first.page_bytes == 2 * 16 * 4 * 8 * 2

    mla = KVTensorLayout("c", "mla", (10, 16, 576), "uint8")
    assert (mla.num_blocks, mla.block_size, mla.page_bytes) == (10, 16, 16 * 576)

    heads = KVTensorLayout("d", "heads_first", (2, 4, 10, 16, 8), "float32")
    assert (heads.num_blocks, heads.block_size, heads.num_views) == (10, 16, 8)
    assert heads.page_bytes == 16 * 8 * 4  # one head's tokens of one block
    assert heads.bytes_per_block == 2 * 4 * 16 * 8 * 4


def test_heads_first_block_is_a_token_range_of_the_batch1_cache() -> None:
    torch = pytest.importorskip("torch")
    from kvoffload.transfer.views import block_byte_views

    kv = torch.randn(2, 3, 5, 4, 8)  # K/V, heads, blocks, tokens, head size
    layout = KVCacheLayout.from_tensors([kv], "heads_first")
    k_hf = kv[0].view(1, 3, 5 * 4, 8)  # [batch, kv_heads, seq, head_dim]
    v_hf = kv[1].view(1, 3, 5 * 4, 8)
    views = block_byte_views(layout, [kv])[0]
    assert len(views) == 6
    for head in range(3):
        k_page = k_hf[0, head, 2 * 4 : 3 * 4].contiguous().view(torch.uint8).flatten()
        v_page = v_hf[0, head, 2 * 4 : 3 * 4].contiguous().view(torch.uint8).flatten()
        assert torch.equal(views[head][2], k_page)
        assert torch.equal(views[3 + head][2], v_page)


@pytest.mark.parametrize(
    ("kind", "shape", "message"),
    [
        ("kv_first", (3, 10, 16, 4, 8), "shape\\[0\\] == 2"),
        ("kv_first", (2, 10, 16, 4), "needs a shape"),
        ("blocks_first", (10, 3, 16, 4, 8), "shape\\[1\\] == 2"),
        ("mla", (10, 16, 0), "shape\\[2\\] must be an int >= 1"),
        ("mla", (10, 16, 4, 4), "needs a shape"),
        ("paged", (10, 16, 4), "kind must be one of"),
        ("heads_first", (3, 2, 10, 16, 4), "shape\\[0\\] == 2"),
        ("heads_first", (2, 10, 16, 4), "needs a shape"),
    ],
)
def test_bad_shapes_and_kinds_name_the_tensor(
    kind: str, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        KVTensorLayout("layer.7", kind, shape, "float16")
    assert "layer.7" in str(info.value)


@pytest.mark.parametrize("dtype", ["int64", "bool", "complex64", "float64"])
def test_unsupported_dtypes_are_rejected(dtype: str) -> None:
    with pytest.raises(ValueError, match="not supported"):
        KVTensorLayout("x", "mla", (4, 16, 8), dtype)


def test_dtype_names_accept_torch_spelling() -> None:
    assert dtype_name("torch.bfloat16") == "bfloat16"
    assert KVTensorLayout("x", "mla", (4, 16, 8), "torch.float8_e4m3fn").dtype == "float8_e4m3fn"


def test_group_must_share_block_ids() -> None:
    a = KVTensorLayout("a", "kv_first", (2, 10, 16, 4, 8), "float16")
    b = KVTensorLayout("b", "kv_first", (2, 12, 16, 4, 8), "float16")
    with pytest.raises(ValueError, match="shares its block ids"):
        KVCacheLayout([a, b])


def test_groups_must_be_numbered_without_gaps_and_names_unique() -> None:
    a = KVTensorLayout("a", "mla", (10, 16, 8), "float16", group=0)
    c = KVTensorLayout("c", "mla", (10, 16, 8), "float16", group=2)
    with pytest.raises(ValueError, match="without gaps"):
        KVCacheLayout([a, c])
    with pytest.raises(ValueError, match="unique"):
        KVCacheLayout([a, a])
    with pytest.raises(ValueError, match="at least one"):
        KVCacheLayout([])


def test_slot_layout_places_every_view_back_to_back() -> None:
    layout = KVCacheLayout(
        [
            KVTensorLayout("k0", "kv_first", (2, 10, 16, 2, 8), "float16"),  # page 512
            KVTensorLayout("m1", "mla", (10, 16, 24), "float16"),  # page 768
        ]
    )
    slots = layout.slot_layout(blocks_per_chunk=4)
    regions = slots.regions[0]
    assert [(r.tensor_index, r.view_index, r.offset, r.page_bytes) for r in regions] == [
        (0, 0, 0, 512),
        (0, 1, 4 * 512, 512),
        (1, 0, 8 * 512, 768),
    ]
    assert slots.slot_bytes == 4 * (512 + 512 + 768)
    assert slots.chunk_bytes(0) == slots.slot_bytes
    assert slots.word_size == 8


def test_slot_of_several_groups_fits_the_largest_group() -> None:
    layout = KVCacheLayout(
        [
            KVTensorLayout("a", "mla", (10, 16, 8), "float16", group=0),
            KVTensorLayout("b", "mla", (10, 16, 8), "float16", group=1),
            KVTensorLayout("c", "mla", (10, 16, 8), "float16", group=1),
        ]
    )
    slots = layout.slot_layout(2)
    assert slots.chunk_bytes(0) == 2 * 256
    assert slots.chunk_bytes(1) == 2 * 2 * 256
    assert slots.slot_bytes == slots.chunk_bytes(1)
    assert [r.offset for r in slots.regions[1]] == [0, 512]


def test_word_size_follows_the_narrowest_page() -> None:
    layout = KVCacheLayout([KVTensorLayout("x", "mla", (4, 3, 1), "uint8")])  # 3-byte pages
    assert layout.slot_layout(1).word_size == 1
    layout = KVCacheLayout([KVTensorLayout("x", "mla", (4, 2, 1), "uint8")])
    assert layout.slot_layout(1).word_size == 2


@pytest.mark.parametrize("bad", [0, -1])
def test_blocks_per_chunk_must_be_positive(bad: int) -> None:
    layout = KVCacheLayout([KVTensorLayout("x", "mla", (4, 16, 8), "float16")])
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        layout.slot_layout(bad)
    with pytest.raises(TypeError, match="blocks_per_chunk"):
        layout.slot_layout(1.5)  # type: ignore[arg-type]


def test_tokens_per_chunk_converts_to_blocks_per_chunk() -> None:
    layout = KVCacheLayout([KVTensorLayout("x", "mla", (4, 16, 8), "float16")])
    assert layout.blocks_per_chunk_for_tokens(64) == 4
    with pytest.raises(ValueError, match="multiple of the device block size 16"):
        layout.blocks_per_chunk_for_tokens(40)


def test_from_tensors_reads_shape_dtype_names_and_groups() -> None:
    tensors = {
        "q": FakeTensor((2, 6, 16, 2, 8), "torch.float16"),
        "r": FakeTensor((6, 16, 8), "uint8"),
    }
    layout = KVCacheLayout.from_tensors(tensors, kind=["kv_first", "mla"], groups=[0, 1])
    assert [t.name for t in layout.tensors] == ["q", "r"]
    assert layout.num_groups == 2
    assert layout.group_tensors(1) == (1,)
    with pytest.raises(ValueError, match="2 tensors"):
        KVCacheLayout.from_tensors(tensors, kind=["mla"])
    with pytest.raises(TypeError, match="must be a tensor"):
        KVCacheLayout.from_tensors([object()])


def test_budget_gives_exact_floor_of_slots() -> None:
    assert slots_for_budget(3000, 10_000) == 3  # no power-of-two rounding either way
    with pytest.raises(ValueError, match="holds no slot"):
        slots_for_budget(3000, 2999)
