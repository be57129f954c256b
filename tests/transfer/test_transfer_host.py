"""The host buffer: exact size from the budget, slot-major, page-aligned."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvoffload.layout import KVCacheLayout, KVTensorLayout  # noqa: E402
from kvoffload.transfer.host import PAGE_BYTES, HostBuffer  # noqa: E402


def _slot_layout():  # type: ignore[no-untyped-def]
    layout = KVCacheLayout([KVTensorLayout("x", "kv_first", (2, 8, 16, 3, 8), "float16")])
    return layout.slot_layout(1)  # 1536 bytes per slot: not a power of two


def test_budget_is_used_exactly_without_rounding() -> None:
    slots = _slot_layout()
    budget = 10 * slots.slot_bytes + slots.slot_bytes - 1
    host = HostBuffer.for_budget(slots, budget, pin=False)
    assert host.num_slots == 10
    assert host.nbytes == 10 * slots.slot_bytes
    assert host.tensor.shape == (10, slots.slot_bytes)
    # One allocation: the whole tier plus at most one page of alignment slack.
    assert host._raw.numel() == host.nbytes + PAGE_BYTES
    assert host.tensor.data_ptr() % PAGE_BYTES == 0


def test_slots_are_contiguous_views_of_one_region() -> None:
    host = HostBuffer(1536, 4, pin=False)
    base = host.tensor.data_ptr()
    for s in range(4):
        view = host.slot(s)
        assert view.is_contiguous() and view.numel() == 1536
        assert view.data_ptr() == base + s * 1536
    host.slot(2).fill_(7)  # zero-copy: writing the view writes the tier
    assert int(host.tensor[2].sum()) == 7 * 1536
    with pytest.raises(ValueError, match="slot_id"):
        host.slot(4)


def test_bad_sizes_and_pinning_without_cuda() -> None:
    with pytest.raises(ValueError, match="holds no slot"):
        HostBuffer.for_budget(_slot_layout(), 100)
    with pytest.raises(ValueError, match="num_slots"):
        HostBuffer(16, 0)
    with pytest.raises(TypeError, match="slot_bytes"):
        HostBuffer(16.0, 2)  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin=True needs CUDA"):
            HostBuffer(16, 2, pin=True)
        assert not HostBuffer(16, 2).is_pinned


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_with_cuda_host_register() -> None:
    host = HostBuffer(1536, 4, pin=True)
    assert host.is_pinned and host.tensor.is_pinned()
    host.close()
    assert not host.is_pinned


def test_slot_view_is_a_zero_copy_slot_memory() -> None:
    from kvoffload.tiers import SlotMemory

    host = HostBuffer(1536, 4, pin=False)
    assert isinstance(host, SlotMemory)
    view = host.slot_view(3)
    assert not view.readonly and view.contiguous and view.nbytes == 1536
    view[:4] = b"\x01\x02\x03\x04"  # writing the view writes the tier's own bytes
    assert host.tensor[3, :4].tolist() == [1, 2, 3, 4]
    host.slot(1).fill_(9)  # and the other way round
    assert bytes(host.slot_view(1)) == b"\x09" * 1536
    assert bytes(host.slot_view(2)) == bytes(host.tensor[2].tolist())
    with pytest.raises(ValueError, match="slot"):
        host.slot_view(4)
    with pytest.raises(TypeError, match="slot"):
        host.slot_view(1.0)  # type: ignore[arg-type]


def test_slot_view_without_numpy_uses_ctypes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvoffload.transfer import host as host_module

    def no_numpy(self: object) -> None:
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    host = host_module.HostBuffer(64, 2, pin=False)
    host.slot_view(1)[10] = 200
    assert int(host.tensor[1, 10]) == 200
