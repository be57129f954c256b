"""Transfer workers: copy chunks between the engine's KV tensors and the host slots.

The API is vLLM's ``OffloadingWorker`` shape with plain ids: ``submit_store(job_id,
device_block_ids, host_slot_ids)``, ``submit_load(job_id, host_slot_ids,
device_block_ids)``, ``get_finished()``, ``wait(job_ids)``, ``shutdown()``. Chunk ``i`` of
a job is host slot ``host_slot_ids[i]`` and device blocks ``device_block_ids[i*k:(i+1)*k]``
(``k = blocks_per_chunk``), of KV-cache group ``group_ids[i]`` (default 0).

Rules every worker keeps:

* Bad arguments (lengths, ranges, a slot written twice in one store, a device block written
  twice in one load, a job id still in flight) raise ``ValueError`` / ``TypeError`` at
  submit time and nothing is queued.
* A job that fails while copying is reported ``success=False`` with the error text; the
  worker keeps running.
* Jobs that touch the same slot or device block run in submission order when one of them
  writes it (see :mod:`kvoffload.transfer.hazards`); other jobs may run concurrently.

:class:`~kvoffload.transfer.cpu_worker.CPUTransferWorker` (KV tensors in host memory) and
:class:`~kvoffload.transfer.cuda_worker.CudaTransferWorker` implement it;
:func:`kvoffload.transfer.factory.create_transfer_worker` picks one from the tensors' device.
"""

from __future__ import annotations

import operator
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvoffload.layout import HostSlotLayout, KVCacheLayout
from kvoffload.transfer.hazards import HazardTracker
from kvoffload.transfer.host import HostBuffer
from kvoffload.transfer.views import block_views, host_region_views, host_words, ordered_tensors

STORE = "store"
LOAD = "load"


@dataclass(frozen=True)
class TransferResult:
    """Outcome of one job: payload bytes moved and the seconds the copy itself took."""

    job_id: int
    success: bool
    bytes: int
    seconds: float
    kind: str  # "store" (device -> host) or "load" (host -> device)
    error: str | None = None


@dataclass(frozen=True)
class TransferPart:
    """The chunks of one job that belong to one KV-cache group."""

    group: int
    slots: list[int]
    blocks: list[int]  # len(slots) * blocks_per_chunk; chunk i = blocks[i*k:(i+1)*k]


class TransferJob:
    """A submitted job and the state its executor needs (identity-hashed)."""

    def __init__(self, job_id: int, kind: str, parts: list[TransferPart], nbytes: int) -> None:
        self.job_id = job_id
        self.kind = kind
        self.parts = parts
        self.nbytes = nbytes
        self.done = threading.Event()
        self.start_event: Any = None  # CUDA timing events, set by the CUDA worker
        self.end_event: Any = None


def as_int_list(values: Iterable[Any], name: str) -> list[int]:
    """``values`` (a sequence, tensor or array of ints) as a list of Python ints."""
    tolist = getattr(values, "tolist", None)
    if callable(tolist):  # torch tensors, numpy arrays
        values = tolist()
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"{name} must be a sequence of ints") from None


def _check_range(values: list[int], limit: int, name: str) -> None:
    if values and (min(values) < 0 or max(values) >= limit):
        bad = next(v for v in values if not 0 <= v < limit)
        raise ValueError(f"{name}: id {bad} is out of range [0, {limit - 1}]")


class TransferWorker(ABC):
    """Common bookkeeping of transfer workers; subclasses run the copies.

    Args:
        layout: the engine's KV tensors.
        slot_layout: the host slot map (``layout.slot_layout(blocks_per_chunk)``).
        host: the CPU tier's memory; its slot size must equal ``slot_layout.slot_bytes``.
        kv_caches: the engine's KV tensors, in layout order or by name.
    """

    def __init__(
        self,
        layout: KVCacheLayout,
        slot_layout: HostSlotLayout,
        host: HostBuffer,
        kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    ) -> None:
        if host.slot_bytes != slot_layout.slot_bytes:
            raise ValueError(
                f"host buffer slots have {host.slot_bytes} bytes but the slot layout needs "
                f"{slot_layout.slot_bytes}"
            )
        if slot_layout.num_groups != layout.num_groups:
            raise ValueError("slot_layout was not built from this layout (group counts differ)")
        tensors = ordered_tensors(layout, kv_caches)
        self.layout = layout
        self.slot_layout = slot_layout
        self.host = host
        self.device = tensors[0].device
        self._block_views = block_views(layout, tensors, slot_layout)
        self._host_words = host_words(host.tensor, slot_layout)
        self._host_regions = host_region_views(self._host_words, slot_layout)
        self._lock = threading.RLock()
        self._hazards: HazardTracker[TransferJob] = HazardTracker()
        self._pending: dict[int, TransferJob] = {}
        self._finished: list[TransferResult] = []
        self._closed = False

    # ------------------------------------------------------------------ public API
    def submit_store(
        self,
        job_id: int,
        device_block_ids: Sequence[int],
        host_slot_ids: Sequence[int],
        group_ids: Sequence[int] | None = None,
    ) -> None:
        """Copy device blocks into host slots (device -> host)."""
        self._submit(STORE, job_id, host_slot_ids, device_block_ids, group_ids)

    def submit_load(
        self,
        job_id: int,
        host_slot_ids: Sequence[int],
        device_block_ids: Sequence[int],
        group_ids: Sequence[int] | None = None,
    ) -> None:
        """Copy host slots into device blocks (host -> device)."""
        self._submit(LOAD, job_id, host_slot_ids, device_block_ids, group_ids)

    def get_finished(self) -> list[TransferResult]:
        """Results of the jobs that finished since the last call, each reported once."""
        self._poll()
        with self._lock:
            results, self._finished = self._finished, []
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the given jobs finished (ids no longer in flight return at once)."""
        for job_id in job_ids:
            with self._lock:
                job = self._pending.get(job_id)
            if job is not None:
                self._wait_job(job)
        self._poll()

    def wait_all(self) -> None:
        """Block until every submitted job finished."""
        with self._lock:
            ids = list(self._pending)
        self.wait(ids)

    @property
    def num_pending(self) -> int:
        """Jobs submitted and not finished yet."""
        with self._lock:
            return len(self._pending)

    def shutdown(self) -> None:
        """Finish the jobs in flight, then refuse new ones. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.wait_all()
        self._stop()

    def __enter__(self) -> TransferWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ----------------------------------------------------------- for subclasses
    @abstractmethod
    def _start(self, job: TransferJob, deps: set[TransferJob]) -> None:
        """Begin running ``job`` after ``deps``; must eventually call :meth:`_finish`."""

    def _poll(self) -> None:  # noqa: B027 - optional hook
        """Detect finished jobs that report completion lazily (CUDA events)."""

    def _wait_job(self, job: TransferJob) -> None:
        job.done.wait()

    def _stop(self) -> None:  # noqa: B027 - optional hook
        """Release executor resources once every job finished."""

    def _finish(self, job: TransferJob, success: bool, seconds: float, error: str | None) -> None:
        result = TransferResult(
            job.job_id, success, job.nbytes if success else 0, seconds, job.kind, error
        )
        with self._lock:
            if self._pending.get(job.job_id) is not job:
                return  # already reported (two threads polled the same completion)
            self._hazards.remove(job)
            del self._pending[job.job_id]
            self._finished.append(result)
        job.done.set()

    # ------------------------------------------------------------------ internals
    def _submit(
        self,
        kind: str,
        job_id: int,
        host_slot_ids: Sequence[int],
        device_block_ids: Sequence[int],
        group_ids: Sequence[int] | None,
    ) -> None:
        if isinstance(job_id, bool) or not isinstance(job_id, int):
            raise TypeError(f"job_id must be an int, got {type(job_id).__name__}")
        parts = self._parts(kind, host_slot_ids, device_block_ids, group_ids)
        nbytes = sum(len(p.slots) * self.slot_layout.chunk_bytes(p.group) for p in parts)
        job = TransferJob(job_id, kind, parts, nbytes)
        slots = [("slot", s) for p in parts for s in p.slots]
        blocks = [("block", p.group, b) for p in parts for b in p.blocks]
        reads, writes = (blocks, slots) if kind == STORE else (slots, blocks)
        with self._lock:
            if self._closed:
                raise RuntimeError("the transfer worker was shut down")
            if job_id in self._pending:
                raise ValueError(f"job_id {job_id} is still in flight; job ids must be unique")
            deps = self._hazards.add(job, reads, writes)
            self._pending[job_id] = job
            if not parts:
                self._finish(job, True, 0.0, None)
                return
            self._start(job, deps)

    def _parts(
        self,
        kind: str,
        host_slot_ids: Sequence[int],
        device_block_ids: Sequence[int],
        group_ids: Sequence[int] | None,
    ) -> list[TransferPart]:
        slots = as_int_list(host_slot_ids, "host_slot_ids")
        blocks = as_int_list(device_block_ids, "device_block_ids")
        bpc = self.slot_layout.blocks_per_chunk
        n = len(slots)
        if len(blocks) != n * bpc:
            raise ValueError(
                f"device_block_ids: {n} chunks of blocks_per_chunk={bpc} need {n * bpc} device "
                f"block ids, got {len(blocks)}"
            )
        num_groups = self.layout.num_groups
        if group_ids is None:
            if num_groups > 1:
                raise ValueError(
                    f"group_ids is required: the layout has {num_groups} KV-cache groups"
                )
            groups = [0] * n
        else:
            groups = as_int_list(group_ids, "group_ids")
            if len(groups) != n:
                raise ValueError(f"group_ids: need one group per chunk ({n}), got {len(groups)}")
            _check_range(groups, num_groups, "group_ids")
        _check_range(slots, self.host.num_slots, "host_slot_ids")
        if kind == STORE and len(set(slots)) != n:
            raise ValueError("host_slot_ids: a store cannot write one slot twice")
        by_group: dict[int, tuple[list[int], list[int]]] = {}
        for i, (slot, group) in enumerate(zip(slots, groups, strict=True)):
            part_slots, part_blocks = by_group.setdefault(group, ([], []))
            part_slots.append(slot)
            part_blocks.extend(blocks[i * bpc : (i + 1) * bpc])
        parts = []
        for group, (part_slots, part_blocks) in sorted(by_group.items()):
            _check_range(part_blocks, self.layout.num_blocks(group), "device_block_ids")
            if kind == LOAD and len(set(part_blocks)) != len(part_blocks):
                raise ValueError("device_block_ids: a load cannot write one device block twice")
            parts.append(TransferPart(group, part_slots, part_blocks))
        return parts

    def _part_views(self, part: TransferPart) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``(device view (blocks, words), host region (slots, k, words))`` of each region."""
        regions = self.slot_layout.regions[part.group]
        return [
            (self._block_views[r.tensor_index][r.view_index], host)
            for r, host in zip(regions, self._host_regions[part.group], strict=True)
        ]


__all__ = [
    "LOAD",
    "STORE",
    "TransferJob",
    "TransferPart",
    "TransferResult",
    "TransferWorker",
    "as_int_list",
]
