"""CPU transfer worker: copies between KV tensors in host memory and the host slots.

How a job runs:

* One dispatcher thread per direction takes jobs in submission order (so loads are not stuck
  behind a long store) and waits for the jobs it depends on (see
  :mod:`kvoffload.transfer.hazards`).
* The job becomes a list of ``(destination, source)`` views: for every layer view, one pair
  per run of chunks whose slots and device blocks both advance by one, made by
  ``tensor_split`` (no Python loop per block per layer).
* The pairs are copied by ``torch._foreach_copy_``: one pass over the bytes, with the GIL
  released. A fused list copy of page-sized views runs on one thread while one big ``copy_``
  uses every intra-op thread, so a large job is cut into that many byte-balanced shares
  copied in parallel (figures in ``docs/benchmarks.md``).

Why not ``index_select`` into a staging tensor plus ``index_copy_``: that moves every byte
twice, far below the same-run copy ceiling (``docs/benchmarks.md``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import torch

from kvoffload.layout import HostSlotLayout, KVCacheLayout
from kvoffload.transfer.host import HostBuffer
from kvoffload.transfer.worker import LOAD, STORE, TransferJob, TransferWorker

logger = logging.getLogger(__name__)


class _Splitter:
    """Views of chosen row spans of 2-D tensors, made by torch in one call per tensor.

    ``tensor_split`` at ``[start, start + length]`` of every span yields every span as a view
    without a Python loop per row; the same split points serve every layer of a job.
    Spans must be disjoint or identical.
    """

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        unique = sorted(set(spans))
        self._points = [p for start, length in unique for p in (start, start + length)]
        position = {span: i for i, span in enumerate(unique)}
        self._order = [position[span] for span in spans]

    def pick(self, matrix: torch.Tensor) -> list[torch.Tensor]:
        pieces = matrix.tensor_split(self._points)[1::2]
        return list(map(pieces.__getitem__, self._order))


class RowRuns:
    """Row pairs ``src_rows[i] -> dst_rows[i]`` merged into runs that advance together.

    Consecutive pairs whose source and destination rows both grow by their step (1, or
    ``blocks_per_chunk`` on the device side of whole chunks) become one copy of several
    rows (a fresh cache maps slots 0, 1, 2, ... to consecutive blocks), which cuts the
    per-copy overhead. Rows repeated on one side (a block stored into two slots, a slot
    loaded into two blocks) are never merged. A span covers ``length * step`` rows.
    """

    def __init__(
        self, src_rows: list[int], dst_rows: list[int], src_step: int = 1, dst_step: int = 1
    ) -> None:
        runs: list[tuple[int, int, int]] = []  # (src start, dst start, length)
        mergeable = len(set(src_rows)) == len(src_rows) and len(set(dst_rows)) == len(dst_rows)
        for s, d in zip(src_rows, dst_rows, strict=True):
            if mergeable and runs:
                s0, d0, length = runs[-1]
                if s == s0 + length * src_step and d == d0 + length * dst_step:
                    runs[-1] = (s0, d0, length + 1)
                    continue
            runs.append((s, d, 1))
        self.num_runs = len(runs)
        self.longest = max((n for _, _, n in runs), default=0)
        self._src = _Splitter([(s, n * src_step) for s, _, n in runs])
        self._dst = _Splitter([(d, n * dst_step) for _, d, n in runs])

    def pick_src(self, matrix: torch.Tensor) -> list[torch.Tensor]:
        """The source spans of ``matrix``, one view per run."""
        return self._src.pick(matrix)

    def pick_dst(self, matrix: torch.Tensor) -> list[torch.Tensor]:
        """The destination spans of ``matrix``, one view per run."""
        return self._dst.pick(matrix)


def chunk_starts(blocks: list[int], blocks_per_chunk: int) -> list[int] | None:
    """Each chunk's first device block, when every chunk is ``blocks_per_chunk`` consecutive
    blocks and no block repeats; else ``None``.

    Such a chunk is one contiguous row span on the device side and one in its slot, so it
    moves as one copy per layer view (and runs of chunks as one strided copy) instead of
    one copy per device block.
    """
    if blocks_per_chunk == 1 or len(set(blocks)) != len(blocks):
        return None
    starts = blocks[::blocks_per_chunk]
    for i, first in enumerate(starts):
        chunk = blocks[i * blocks_per_chunk : (i + 1) * blocks_per_chunk]
        if chunk != list(range(first, first + blocks_per_chunk)):
            return None
    return starts


_SPLIT_BYTES = 8 << 20  # below this a job is copied by the calling thread alone
_pool: ThreadPoolExecutor | None = None


def _copy_serial(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    # Inference mode is per thread and this runs on the worker's threads: the engine's KV
    # tensors or the host buffer may be inference tensors (built under
    # torch.inference_mode(), as Hugging Face users do), which take in-place writes only
    # inside it. On normal tensors it changes nothing the copy does.
    with torch.inference_mode():
        foreach_copy = getattr(torch, "_foreach_copy_", None)
        if foreach_copy is not None:
            foreach_copy(dst, src)
            return
        for d, s in zip(dst, src, strict=True):
            d.copy_(s)


def copy_pairs(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, split across torch's intra-op thread count.

    A fused list copy of many page-sized views runs on one thread, while one large ``copy_``
    uses every intra-op thread; so a large job is cut into that many byte-balanced shares,
    copied in parallel (torch releases the GIL).
    """
    global _pool
    threads = torch.get_num_threads()
    total = sum(t.numel() * t.element_size() for t in dst)
    if threads <= 1 or len(dst) < 2 * threads or total < _SPLIT_BYTES:
        _copy_serial(dst, src)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvoffload-copy")
    share = total / threads
    cuts, acc = [0], 0
    for i, t in enumerate(dst):
        acc += t.numel() * t.element_size()
        if acc >= share * len(cuts) and len(cuts) < threads:
            cuts.append(i + 1)
    cuts.append(len(dst))
    futures = [_pool.submit(_copy_serial, dst[a:b], src[a:b]) for a, b in pairwise(cuts) if b > a]
    for future in futures:
        future.result()


class CPUTransferWorker(TransferWorker):
    """Transfer worker for KV tensors in host memory (see the module docstring)."""

    def __init__(
        self,
        layout: KVCacheLayout,
        slot_layout: HostSlotLayout,
        host: HostBuffer,
        kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
    ) -> None:
        super().__init__(layout, slot_layout, host, kv_caches)
        if self.device.type != "cpu":
            raise ValueError(
                f"CPUTransferWorker needs KV tensors in host memory, got {self.device}; "
                "use create_transfer_worker to pick the worker for the device"
            )
        self._queues: dict[str, queue.SimpleQueue[tuple[TransferJob, set[TransferJob]] | None]]
        self._queues = {kind: queue.SimpleQueue() for kind in (STORE, LOAD)}
        self._dispatchers = [
            threading.Thread(
                target=self._dispatch, args=(q,), name=f"kvoffload-{kind}", daemon=True
            )
            for kind, q in self._queues.items()
        ]
        for thread in self._dispatchers:
            thread.start()

    def _start(self, job: TransferJob, deps: set[TransferJob]) -> None:
        self._queues[job.kind].put((job, deps))

    def _dispatch(
        self, jobs: queue.SimpleQueue[tuple[TransferJob, set[TransferJob]] | None]
    ) -> None:
        # Deadlock-free: a dependency was submitted earlier, and the earliest unfinished job
        # has no unfinished dependency and heads its direction's queue.
        while True:
            item = jobs.get()
            if item is None:
                return
            job, deps = item
            for dep in deps:
                dep.done.wait()
            start = time.perf_counter()
            try:
                self._copy(job)
            except Exception as exc:
                logger.exception("transfer job %s (%s) failed", job.job_id, job.kind)
                error = f"{type(exc).__name__}: {exc}"
                self._finish(job, False, time.perf_counter() - start, error)
            else:
                self._finish(job, True, time.perf_counter() - start, None)

    def _copy(self, job: TransferJob) -> None:
        bpc = self.slot_layout.blocks_per_chunk
        store = job.kind == STORE
        dst: list[torch.Tensor] = []
        src: list[torch.Tensor] = []
        for part in job.parts:
            views = self._part_views(part)
            starts = chunk_starts(part.blocks, bpc)
            if starts is not None:  # whole chunks: device rows [b, b + bpc) <-> one slot
                if store:
                    runs = RowRuns(starts, part.slots, src_step=bpc)
                else:
                    runs = RowRuns(part.slots, starts, dst_step=bpc)
                for device, host in views:
                    # A slot's region holds its chunk's pages back to back: flat 2-D copies.
                    rows = (runs.pick_src if store else runs.pick_dst)(device)
                    chunks = [r.view(-1, bpc * r.shape[1]) for r in rows]
                    slots = (runs.pick_dst if store else runs.pick_src)(host.flatten(1))
                    src += chunks if store else slots
                    dst += slots if store else chunks
                continue
            for j in range(bpc):  # the j-th device block of every chunk
                blocks = part.blocks[j::bpc]
                runs = RowRuns(blocks, part.slots) if store else RowRuns(part.slots, blocks)
                for device, host in views:
                    host_j = host[:, j]
                    src += runs.pick_src(device if store else host_j)
                    dst += runs.pick_dst(host_j if store else device)
        copy_pairs(dst, src)

    def _stop(self) -> None:
        for q in self._queues.values():
            q.put(None)
        for thread in self._dispatchers:
            thread.join()


__all__ = ["CPUTransferWorker", "RowRuns", "chunk_starts", "copy_pairs"]
