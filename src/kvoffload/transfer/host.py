"""The CPU tier's memory: one allocation, sized exactly from a byte budget, slot-major.

Why one plain allocation registered with the driver instead of ``pin_memory=True``: torch's
pinned caching allocator rounds every allocation up to a power of two, so a 40 GiB tier can
take 64 GiB of host memory (vLLM issue #46278). Here the tier takes ``num_slots *
slot_bytes`` bytes (plus at most one page for alignment), and when CUDA is available the
pages are page-locked with ``cudaHostRegister`` so device copies run as asynchronous DMA.

Slot-major: slot ``i`` is bytes ``[i * slot_bytes, (i + 1) * slot_bytes)``, holding one
chunk for every layer of its group, so a disk or remote tier can move a slot as one buffer.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from typing import Any

import torch

from kvoffload._checks import check_int
from kvoffload.layout import HostSlotLayout, slots_for_budget

logger = logging.getLogger(__name__)

PAGE_BYTES = 4096


def _register(ptr: int, nbytes: int) -> str | None:
    """Page-lock ``nbytes`` at ``ptr``; return an error text, or ``None`` on success."""
    try:
        err = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    except Exception as exc:  # no CUDA runtime binding, driver error, ...
        return f"{type(exc).__name__}: {exc}"
    code = int(getattr(err, "value", err))
    return None if code == 0 else f"cudaHostRegister returned error {code} ({err})"


def _unregister(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception as exc:  # at interpreter exit the runtime may be gone already
        logger.debug("cudaHostUnregister failed: %s", exc)


def _byte_view(flat: torch.Tensor) -> memoryview:
    """A writable, flat ``memoryview`` of a contiguous uint8 CPU tensor, sharing its memory.

    Through NumPy when it is installed (the view then keeps the tensor alive); otherwise
    through ctypes, whose view is valid while the owner keeps the tensor (``HostBuffer`` does).
    """
    try:
        return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]
    except (ImportError, RuntimeError):  # torch built without NumPy support
        array = (ctypes.c_ubyte * flat.numel()).from_address(flat.data_ptr())
        return memoryview(array).cast("B")


class HostBuffer:
    """``num_slots`` slots of ``slot_bytes`` bytes in one page-aligned host allocation.

    Args:
        slot_bytes: bytes per slot (:attr:`HostSlotLayout.slot_bytes`).
        num_slots: number of slots (>= 1).
        pin: ``None`` = page-lock when CUDA is available (a failure only logs a warning: copies
            still work, synchronously); ``True`` = page-lock or raise; ``False`` = never.
    """

    def __init__(self, slot_bytes: int, num_slots: int, pin: bool | None = None) -> None:
        check_int("slot_bytes", slot_bytes, 1)
        check_int("num_slots", num_slots, 1)
        if pin is True and not torch.cuda.is_available():
            raise ValueError("pin=True needs CUDA, which is not available; use pin=None or False")
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.nbytes = slot_bytes * num_slots
        raw = torch.empty(self.nbytes + PAGE_BYTES, dtype=torch.uint8)
        skip = (-raw.data_ptr()) % PAGE_BYTES
        flat = raw[skip : skip + self.nbytes]
        self._raw = raw  # keeps the allocation alive
        #: ``(num_slots, slot_bytes)`` uint8 view of the whole tier.
        self.tensor = flat.view(num_slots, slot_bytes)
        self._view = _byte_view(flat)
        self.is_pinned = False
        if pin is not False and torch.cuda.is_available():
            error = _register(flat.data_ptr(), self.nbytes)
            if error is None:
                self.is_pinned = True
                self._finalizer: Any = weakref.finalize(self, _unregister, flat.data_ptr())
            elif pin:
                raise RuntimeError(f"cannot page-lock the {self.nbytes}-byte host buffer: {error}")
            else:
                logger.warning(
                    "host buffer of %d bytes is not page-locked (%s): device copies will be "
                    "synchronous",
                    self.nbytes,
                    error,
                )

    @classmethod
    def for_budget(
        cls, slot_layout: HostSlotLayout, budget_bytes: int, pin: bool | None = None
    ) -> HostBuffer:
        """As many slots as fit in ``budget_bytes`` (``budget // slot_bytes``, no rounding up)."""
        num_slots = slots_for_budget(slot_layout.slot_bytes, budget_bytes)
        return cls(slot_layout.slot_bytes, num_slots, pin)

    def slot(self, slot_id: int) -> torch.Tensor:
        """The contiguous bytes of one slot (a view: zero-copy for disk or network I/O)."""
        if not 0 <= slot_id < self.num_slots:
            raise ValueError(f"slot_id must be in [0, {self.num_slots - 1}], got {slot_id}")
        return self.tensor[slot_id]

    def slot_view(self, slot: int) -> memoryview:
        """One slot as a writable ``memoryview`` over the buffer's own bytes (zero-copy).

        This makes the buffer a :class:`kvoffload.tiers.SlotMemory`: a disk or remote tier
        reads and writes the slot in place (``os.preadv`` into it, a socket's bytes copied
        straight in), with no intermediate tensor or ``bytes``.
        """
        if isinstance(slot, bool) or not isinstance(slot, int):
            raise TypeError(f"slot must be an int, got {type(slot).__name__}")
        if not 0 <= slot < self.num_slots:
            raise ValueError(f"slot must be in [0, {self.num_slots - 1}], got {slot}")
        start = slot * self.slot_bytes
        return self._view[start : start + self.slot_bytes]

    def close(self) -> None:
        """Unpin the memory now (it is freed when the last view of it is gone)."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        self.is_pinned = False

    def __repr__(self) -> str:
        return (
            f"HostBuffer(num_slots={self.num_slots}, slot_bytes={self.slot_bytes}, "
            f"nbytes={self.nbytes}, pinned={self.is_pinned})"
        )


__all__ = ["PAGE_BYTES", "HostBuffer"]
