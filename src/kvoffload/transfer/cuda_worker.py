"""CUDA transfer worker: DMA between device KV blocks and page-locked host slots on side streams.

How a job runs (one store stream and one load stream per worker, so stores never delay loads):

* **Store** (device -> host): the store stream first waits for the caller's current (compute)
  stream, so the copy reads the KV the model just wrote, then for the unfinished jobs it
  depends on (:mod:`kvoffload.transfer.hazards`). It gathers the chunks' pages of every layer
  into a device staging buffer laid out exactly like the host slots (a device-side copy at HBM
  speed), then copies each run of consecutive slots to the host with one DMA.
* **Load** (host -> device): the load stream waits for the compute stream (the target blocks
  may have been in use until now) and for its dependencies (an earlier store to the same slot
  is never overtaken), DMAs each run of consecutive slots into staging, then scatters the
  pages into the device blocks.

A slot is contiguous on the host, so DMAs are large (a whole chunk for every layer) instead
of one small copy per block per layer: a job of ``n`` chunks over ``R`` layer views costs two
indexed-copy kernels per view and staging batch (a gather or scatter of all the batch's blocks
at once) plus one DMA per run of consecutive slots, whatever the block size. Staging is
bounded (``staging_bytes``, at least one slot); larger jobs run in batches on the same
stream, which orders reuse of the buffer. Completion and timing come from CUDA events;
``get_finished`` polls them without blocking.

``copy_mode="direct"`` is the alternative this design is measured against
(``benchmarks/transfer_bandwidth.py``): no staging, one ``cudaMemcpyAsync`` per device-block
page per layer view, straight between the KV tensor and the page-locked slot. It is correct
(the same tests run it) but pays one copy's fixed cost per page, which small blocks feel most.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import torch

from kvoffload._checks import check_int
from kvoffload.layout import HostSlotLayout, KVCacheLayout
from kvoffload.transfer.host import HostBuffer
from kvoffload.transfer.views import word_dtype
from kvoffload.transfer.worker import STORE, TransferJob, TransferPart, TransferWorker

logger = logging.getLogger(__name__)

#: ``staged``: gather into slot-shaped staging, one DMA per slot run (the default).
#: ``direct``: one copy per block page per layer view (the baseline it is measured against).
COPY_MODES = ("staged", "direct")


def slot_runs(slots: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """``(first index, end index, first slot)`` of each run of consecutive ascending slots."""
    n = len(slots)
    i = 0
    while i < n:
        j = i + 1
        while j < n and slots[j] == slots[j - 1] + 1:
            j += 1
        yield i, j, slots[i]
        i = j


class CudaTransferWorker(TransferWorker):
    """Transfer worker for KV tensors on a CUDA device (see the module docstring).

    Args:
        staging_bytes: device memory for each direction's staging buffer (rounded down to
            whole slots, at least one slot).
        load_waits_for_compute: make loads wait for the compute stream at submission. Keep
            it unless the engine guarantees the target blocks are idle.
        copy_mode: ``"staged"`` (default) or ``"direct"``; see the module docstring.
    """

    def __init__(
        self,
        layout: KVCacheLayout,
        slot_layout: HostSlotLayout,
        host: HostBuffer,
        kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
        staging_bytes: int = 128 << 20,
        load_waits_for_compute: bool = True,
        copy_mode: str = "staged",
    ) -> None:
        if copy_mode not in COPY_MODES:
            raise ValueError(f"copy_mode must be one of {list(COPY_MODES)}, got {copy_mode!r}")
        check_int("staging_bytes", staging_bytes, 1)  # as the config key: at least one byte
        super().__init__(layout, slot_layout, host, kv_caches)
        if self.device.type != "cuda":
            raise ValueError(f"CudaTransferWorker needs KV tensors on CUDA, got {self.device}")
        if not host.is_pinned:
            # Still correct, but every DMA becomes a synchronous staged copy.
            logger.warning(
                "host buffer is not page-locked: device copies will not overlap with compute"
            )
        self._load_waits_for_compute = load_waits_for_compute
        self.copy_mode = copy_mode
        slot_words = slot_layout.slot_bytes // slot_layout.word_size
        # Direct copies need no staging: keep one slot's worth so the buffers always exist.
        staged = copy_mode == "staged"
        self._batch_slots = max(1, staging_bytes // slot_layout.slot_bytes) if staged else 1
        word = word_dtype(slot_layout.word_size)
        with torch.cuda.device(self.device):
            self._store_stream = torch.cuda.Stream(self.device)
            # Loads block a request; stores only free device memory later: loads go first.
            self._load_stream = torch.cuda.Stream(self.device, priority=-1)
            self._store_stage = torch.empty(
                (self._batch_slots, slot_words), dtype=word, device=self.device
            )
            self._load_stage = torch.empty_like(self._store_stage)

    # ------------------------------------------------------------------ running jobs
    def _start(self, job: TransferJob, deps: set[TransferJob]) -> None:
        compute = torch.cuda.current_stream(self.device)
        stream = self._store_stream if job.kind == STORE else self._load_stream
        try:
            # Inference mode: the engine's KV tensors or the host buffer may be inference
            # tensors (built under torch.inference_mode()), which only take in-place writes
            # inside it; on normal tensors it changes nothing the copies do.
            with (
                torch.inference_mode(),
                torch.cuda.device(self.device),
                torch.cuda.stream(stream),
            ):
                if job.kind == STORE or self._load_waits_for_compute:
                    stream.wait_stream(compute)
                for dep in deps:
                    if dep.end_event is not None:
                        stream.wait_event(dep.end_event)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                for part in job.parts:
                    if self.copy_mode == "direct":
                        self._direct_part(part, to_host=job.kind == STORE)
                    elif job.kind == STORE:
                        self._store_part(part)
                    else:
                        self._load_part(part)
                end.record(stream)
        except Exception as exc:
            self._finish(job, False, 0.0, f"{type(exc).__name__}: {exc}")
            return
        job.start_event, job.end_event = start, end

    def _index(self, ids: list[int]) -> torch.Tensor:
        """Device index tensor, copied from page-locked memory so submission never blocks."""
        host_ids = torch.tensor(ids, dtype=torch.int64).pin_memory()
        return host_ids.to(self.device, non_blocking=True)

    def _store_part(self, part: TransferPart) -> None:
        bpc = self.slot_layout.blocks_per_chunk
        chunk_words = self.slot_layout.chunk_bytes(part.group) // self.slot_layout.word_size
        whole_slot = chunk_words == self._host_words.shape[1]
        views = self._part_views(part)
        for b0 in range(0, len(part.slots), self._batch_slots):
            slots = part.slots[b0 : b0 + self._batch_slots]
            k = len(slots)
            index = self._index(part.blocks[b0 * bpc : (b0 + k) * bpc]).view(k, bpc)
            stage = self._store_stage[:k]
            for (device, host_region), region in zip(
                views, self.slot_layout.regions[part.group], strict=True
            ):
                start = region.offset // self.slot_layout.word_size
                width = host_region.shape[1] * host_region.shape[2]
                stage[:, start : start + width].unflatten(1, (bpc, host_region.shape[2])).copy_(
                    device[index]
                )
            self._dma(slots, stage, chunk_words, whole_slot, to_host=True)

    def _load_part(self, part: TransferPart) -> None:
        bpc = self.slot_layout.blocks_per_chunk
        chunk_words = self.slot_layout.chunk_bytes(part.group) // self.slot_layout.word_size
        whole_slot = chunk_words == self._host_words.shape[1]
        views = self._part_views(part)
        for b0 in range(0, len(part.slots), self._batch_slots):
            slots = part.slots[b0 : b0 + self._batch_slots]
            k = len(slots)
            stage = self._load_stage[:k]
            self._dma(slots, stage, chunk_words, whole_slot, to_host=False)
            index = self._index(part.blocks[b0 * bpc : (b0 + k) * bpc])
            for (device, host_region), region in zip(
                views, self.slot_layout.regions[part.group], strict=True
            ):
                start = region.offset // self.slot_layout.word_size
                page = host_region.shape[2]
                pages = stage[:, start : start + bpc * page].reshape(k * bpc, page)
                device.index_copy_(0, index, pages)

    def _direct_part(self, part: TransferPart, to_host: bool) -> None:
        """The baseline: one asynchronous copy per block page per layer view, no staging."""
        bpc = self.slot_layout.blocks_per_chunk
        views = self._part_views(part)
        for i, slot in enumerate(part.slots):
            for j, block in enumerate(part.blocks[i * bpc : (i + 1) * bpc]):
                for device, host_region in views:
                    if to_host:
                        host_region[slot, j].copy_(device[block], non_blocking=True)
                    else:
                        device[block].copy_(host_region[slot, j], non_blocking=True)

    def _dma(
        self,
        slots: list[int],
        stage: torch.Tensor,
        chunk_words: int,
        whole_slot: bool,
        to_host: bool,
    ) -> None:
        """One asynchronous copy per run of consecutive slots (per slot if slots are padded)."""
        host = self._host_words
        if whole_slot:
            pieces = [(host[s0 : s0 + j - i], stage[i:j]) for i, j, s0 in slot_runs(slots)]
        else:  # only the group's chunk, not the padding up to the largest group's slot
            pieces = [(host[s, :chunk_words], stage[i, :chunk_words]) for i, s in enumerate(slots)]
        for host_part, stage_part in pieces:
            if to_host:
                host_part.copy_(stage_part, non_blocking=True)
            else:
                stage_part.copy_(host_part, non_blocking=True)

    # ------------------------------------------------------------ completion
    def _poll(self) -> None:
        with self._lock:
            running = [j for j in self._pending.values() if j.end_event is not None]
        for job in running:
            if job.end_event.query():
                seconds = job.start_event.elapsed_time(job.end_event) / 1e3
                self._finish(job, True, seconds, None)

    def _wait_job(self, job: TransferJob) -> None:
        if job.end_event is not None:
            job.end_event.synchronize()
            self._poll()
        job.done.wait()

    def _stop(self) -> None:
        self._store_stream.synchronize()
        self._load_stream.synchronize()


__all__ = ["COPY_MODES", "CudaTransferWorker", "slot_runs"]
