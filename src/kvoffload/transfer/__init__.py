"""The data plane: KV layouts, the host buffer, transfer workers and the KVOffloader facade.

Needs PyTorch (``pip install 'kvoffload[torch]'``) except :mod:`kvoffload.transfer.layout`,
which is pure Python so a scheduler can size the CPU tier without torch. Names are exported
lazily: importing this package imports torch only when a torch-backed name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KVCacheLayout": "kvoffload.transfer.layout",
    "KVTensorLayout": "kvoffload.transfer.layout",
    "HostSlotLayout": "kvoffload.transfer.layout",
    "SlotRegion": "kvoffload.transfer.layout",
    "slots_for_budget": "kvoffload.transfer.layout",
    "HostBuffer": "kvoffload.transfer.host",
    "TransferResult": "kvoffload.transfer.worker",
    "TransferWorker": "kvoffload.transfer.worker",
    "CPUTransferWorker": "kvoffload.transfer.cpu_worker",
    "create_transfer_worker": "kvoffload.transfer.worker",
    "CudaTransferWorker": "kvoffload.transfer.cuda_worker",
    "KVOffloader": "kvoffload.transfer.offloader",
    "OffloaderStats": "kvoffload.transfer.offloader",
    "TransferError": "kvoffload.transfer.offloader",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvoffload.transfer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
