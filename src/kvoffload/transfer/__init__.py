"""The data plane: the host buffer, transfer workers, the hazard tracker and byte views.

Needs PyTorch (``pip install 'kvoffload[torch]'``). Names are exported lazily: importing this
package imports torch only when a torch-backed name is used. The layout types live in the
pure-Python core (:mod:`kvoffload.layout`) and the facade above the spec
(:mod:`kvoffload.offloader`); both stay reachable from here by name for older imports. The
facade's entries are resolved by name at attribute access (never imported by this package's
modules), so the data plane itself still never imports a layer above it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KVCacheLayout": "kvoffload.layout",
    "KVTensorLayout": "kvoffload.layout",
    "HostSlotLayout": "kvoffload.layout",
    "SlotRegion": "kvoffload.layout",
    "slots_for_budget": "kvoffload.layout",
    "HostBuffer": "kvoffload.transfer.host",
    "TransferResult": "kvoffload.transfer.worker",
    "TransferWorker": "kvoffload.transfer.worker",
    "CPUTransferWorker": "kvoffload.transfer.cpu_worker",
    "create_transfer_worker": "kvoffload.transfer.factory",
    "CudaTransferWorker": "kvoffload.transfer.cuda_worker",
    # Compatibility names for the facade, which moved above the spec (kvoffload.offloader).
    "KVOffloader": "kvoffload.offloader",
    "OffloaderStats": "kvoffload.offloader",
    "TransferError": "kvoffload.offloader",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvoffload.transfer' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = sorted(_EXPORTS)
