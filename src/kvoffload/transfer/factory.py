"""Pick the transfer worker for the KV tensors' device.

Lives apart from :mod:`kvoffload.transfer.worker` so the base class never imports the workers
that subclass it (the import graph stays acyclic); the CUDA worker is imported only for CUDA
tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvoffload.layout import HostSlotLayout, KVCacheLayout
from kvoffload.transfer.host import HostBuffer
from kvoffload.transfer.views import ordered_tensors
from kvoffload.transfer.worker import TransferWorker


def create_transfer_worker(
    layout: KVCacheLayout,
    slot_layout: HostSlotLayout,
    host: HostBuffer,
    kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    staging_bytes: int = 128 << 20,
) -> TransferWorker:
    """The worker for the KV tensors' device: CUDA streams, or a CPU thread pool."""
    tensors = ordered_tensors(layout, kv_caches)
    if tensors[0].device.type == "cuda":
        from kvoffload.transfer.cuda_worker import CudaTransferWorker

        return CudaTransferWorker(layout, slot_layout, host, tensors, staging_bytes=staging_bytes)
    from kvoffload.transfer.cpu_worker import CPUTransferWorker

    return CPUTransferWorker(layout, slot_layout, host, tensors)


__all__ = ["create_transfer_worker"]
