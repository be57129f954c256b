"""Transfer worker throughput as a ratio of the same run's plain-copy ceiling.

For 16-token and 512-token blocks of a Llama-3-8B-shaped KV cache (8 KV heads x 128, fp16,
``--layers`` layers), measure:

* **store** (device blocks -> host slots) and **load** (host slots -> device blocks) through
  the transfer worker, for a random block/slot mapping (the worst case: nothing merges) and a
  sequential one (a fresh cache: consecutive blocks to consecutive slots);
* the **ceiling**: one contiguous ``copy_`` of the same number of bytes between two
  preallocated tensors of the same kind (CPU: host -> host; CUDA: device <-> page-locked host,
  registered the same way as the tier's buffer). On CPU, libc ``memmove`` of the same bytes
  is shown too, as a second reference, and the ratio of the design the CPU worker rejected
  (``index_select`` into staging + ``index_copy_``, "2-pass") on the same job.

On CUDA, ``store`` is device-to-host and ``load`` host-to-device, and the ceiling is the
pinned ``cudaMemcpyAsync`` of the same bytes in the same run. The worker runs in each
``--cuda-copy`` mode: ``staged`` (the default: gather every block of a staging batch per
layer view, one DMA per run of consecutive slots) and ``direct`` (the alternative: one copy
per block page per layer view), so batching is measured against not batching. Each row
carries the issue's target ratio (0.9 of the ceiling for 512-token blocks, 0.6 for 16-token
blocks) and whether it was met.

Ceiling and worker are timed alternately, ``--rounds`` pairs per case; each pair gives a
ratio (ceiling seconds / worker seconds) and the table shows the median ratio with its
interquartile range. Worker times are wall time from submit to completion, so validation
and bookkeeping are included. The host's load average is printed: on a shared machine the
spread says how much to trust the medians.

    python benchmarks/transfer_bandwidth.py            # ~1-2 min on 2 CPU cores
    python benchmarks/transfer_bandwidth.py --quick    # ~20 s
    python benchmarks/transfer_bandwidth.py --json
    python benchmarks/transfer_bandwidth.py --device cuda -o figures.json  # on a GPU
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from kvoffload.layout import KVCacheLayout
from kvoffload.transfer.cuda_worker import COPY_MODES
from kvoffload.transfer.factory import create_transfer_worker
from kvoffload.transfer.host import HostBuffer
from kvoffload.transfer.views import block_views, host_region_views, host_words
from kvoffload.transfer.worker import TransferWorker

KV_HEADS, HEAD_SIZE = 8, 128
#: Target ratio to the ceiling by block size (issue 18): many small copies must be batched.
TARGETS = {512: 0.9, 16: 0.6}


@dataclass
class Row:
    device: str
    block_tokens: int
    mapping: str
    direction: str
    mib: float
    worker_gbps: float
    ceiling_gbps: float
    ratio: float  # median of per-pair ratios
    ratio_q1: float
    ratio_q3: float
    memmove_gbps: float | None = None
    gather_scatter_ratio: float | None = None  # the rejected 2-pass design, same run
    copy_mode: str = "cpu"  # the CUDA worker's copy_mode, or "cpu"
    target: float | None = None
    meets_target: bool | None = None


def _time(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _gbps(nbytes: int, seconds: list[float]) -> float:
    return round(nbytes / statistics.median(seconds) / 1e9, 3)


def _memmove(dst: torch.Tensor, src: torch.Tensor) -> Callable[[], None]:
    nbytes = src.numel() * src.element_size()
    return lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


def _gather_scatter(
    layout: KVCacheLayout,
    caches: list[torch.Tensor],
    host: HostBuffer,
    blocks: list[int],
    slot_ids: list[int],
) -> dict[str, Callable[[], None]]:
    """The design the CPU worker rejected: index_select into staging + index_copy_ (2 passes)."""
    slots = layout.slot_layout(1)
    device_views = [v for views in block_views(layout, caches, slots) for v in views]
    host_views = [r[:, 0] for r in host_region_views(host_words(host.tensor, slots), slots)[0]]
    block_index, slot_index = torch.tensor(blocks), torch.tensor(slot_ids)
    staging = torch.empty(len(blocks), device_views[0].shape[1], dtype=device_views[0].dtype)

    def store() -> None:
        for device, host_view in zip(device_views, host_views, strict=True):
            torch.index_select(device, 0, block_index, out=staging)
            host_view.index_copy_(0, slot_index, staging)

    def load() -> None:
        for device, host_view in zip(device_views, host_views, strict=True):
            torch.index_select(host_view, 0, slot_index, out=staging)
            device.index_copy_(0, block_index, staging)

    return {"store": store, "load": load}


def _run_case(
    device: torch.device,
    block_tokens: int,
    layers: int,
    job_bytes: int,
    rounds: int,
    cuda_modes: tuple[str, ...] = ("staged",),
) -> list[Row]:
    page = block_tokens * KV_HEADS * HEAD_SIZE * 2
    chunk_bytes = 2 * layers * page
    chunks = max(1, job_bytes // chunk_bytes)
    num_blocks = 2 * chunks
    caches = [
        torch.randint(-(2**15), 2**15, (2, num_blocks, block_tokens, KV_HEADS, HEAD_SIZE),
                      dtype=torch.int16, device=device).view(torch.float16)
        for _ in range(layers)
    ]  # fmt: skip
    layout = KVCacheLayout.from_tensors(caches)
    slots = layout.slot_layout(1)
    host = HostBuffer(slots.slot_bytes, 2 * chunks, pin=None if device.type == "cuda" else False)
    host.tensor.zero_()  # fault the pages in before timing
    on_cuda = device.type == "cuda"
    if on_cuda:
        from kvoffload.transfer.cuda_worker import CudaTransferWorker

        workers: dict[str, TransferWorker] = {
            m: CudaTransferWorker(layout, slots, host, caches, copy_mode=m) for m in cuda_modes
        }
    else:
        workers = {"cpu": create_transfer_worker(layout, slots, host, caches)}
    nbytes = chunks * slots.chunk_bytes(0)
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)

    src_dev = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    if on_cuda:
        ceiling_host = HostBuffer(nbytes, 1, pin=None)
        pinned = ceiling_host.tensor[0]
        pinned.zero_()
        ceilings = {
            "store": lambda: pinned.copy_(src_dev, non_blocking=True),
            "load": lambda: src_dev.copy_(pinned, non_blocking=True),
        }
        memmoves: dict[str, Callable[[], None]] = {}
    else:
        dst = torch.zeros(nbytes, dtype=torch.uint8)
        ceilings = {"store": lambda: dst.copy_(src_dev), "load": lambda: src_dev.copy_(dst)}
        memmoves = {"store": _memmove(dst, src_dev), "load": _memmove(src_dev, dst)}

    job_ids = iter(range(1, 1 << 30))

    def job(
        worker: TransferWorker, kind: str, blocks: list[int], slot_ids: list[int]
    ) -> Callable[[], None]:
        def run() -> None:
            job_id = next(job_ids)
            if kind == "store":
                worker.submit_store(job_id, blocks, slot_ids)
            else:
                worker.submit_load(job_id, slot_ids, blocks)
            worker.wait([job_id])
            (result,) = worker.get_finished()
            if not result.success:
                raise RuntimeError(f"{kind} job failed: {result.error}")

        return run

    gen = torch.Generator().manual_seed(block_tokens)
    mappings = {
        "random": (
            torch.randperm(num_blocks, generator=gen)[:chunks].tolist(),
            torch.randperm(2 * chunks, generator=gen)[:chunks].tolist(),
        ),
        "sequential": (list(range(chunks)), list(range(chunks))),
    }
    rows = []
    try:
        for mapping, (blocks, slot_ids) in mappings.items():
            gather = {} if on_cuda else _gather_scatter(layout, caches, host, blocks, slot_ids)
            for kind in ("store", "load"):
                timed = {"ceiling": ceilings[kind]}
                for mode, worker in workers.items():
                    timed[f"worker:{mode}"] = job(worker, kind, blocks, slot_ids)
                if not on_cuda:
                    timed.update(memmove=memmoves[kind], gather_scatter=gather[kind])
                for fn in timed.values():  # warm-up: first touch, allocator, caches
                    fn()
                seconds: dict[str, list[float]] = {name: [] for name in timed}
                for _ in range(rounds):  # interleaved, so load drift hits all alike
                    for name, fn in timed.items():
                        seconds[name].append(_time(fn, sync))
                gather_ratio = None
                if "gather_scatter" in seconds:
                    pairs = zip(seconds["ceiling"], seconds["gather_scatter"], strict=True)
                    gather_ratio = round(statistics.median(c / g for c, g in pairs), 3)
                target = TARGETS.get(block_tokens)
                for mode in workers:
                    worker_s = seconds[f"worker:{mode}"]
                    ratios = [c / w for c, w in zip(seconds["ceiling"], worker_s, strict=True)]
                    q1, median, q3 = _quartiles(ratios)
                    rows.append(
                        Row(
                            device=str(device),
                            block_tokens=block_tokens,
                            mapping=mapping,
                            direction=kind,
                            mib=round(nbytes / 2**20, 1),
                            worker_gbps=_gbps(nbytes, worker_s),
                            ceiling_gbps=_gbps(nbytes, seconds["ceiling"]),
                            ratio=round(median, 3),
                            ratio_q1=round(q1, 3),
                            ratio_q3=round(q3, 3),
                            memmove_gbps=_gbps(nbytes, seconds["memmove"]) if not on_cuda else None,
                            gather_scatter_ratio=gather_ratio,
                            copy_mode=mode,
                            target=target if on_cuda else None,
                            meets_target=(median >= target) if on_cuda and target else None,
                        )
                    )
    finally:
        for worker in workers.values():
            worker.shutdown()
        host.close()
    return rows


def _print_table(rows: list[Row], header: dict[str, object]) -> None:
    print("transfer worker throughput vs the same run's contiguous copy_ ceiling")
    print("  " + ", ".join(f"{k}={v}" for k, v in header.items()))
    cols = ("device", "mode", "tokens", "mapping", "dir", "MiB", "worker GB/s", "copy_ GB/s",
            "ratio", "q1-q3", "target", "memmove GB/s", "2-pass ratio")  # fmt: skip
    table = [
        (r.device, r.copy_mode, str(r.block_tokens), r.mapping, r.direction, f"{r.mib:g}",
         f"{r.worker_gbps:.2f}", f"{r.ceiling_gbps:.2f}", f"{r.ratio:.2f}",
         f"{r.ratio_q1:.2f}-{r.ratio_q3:.2f}",
         "-" if r.target is None else f"{r.target:.1f} {'met' if r.meets_target else 'MISSED'}",
         "-" if r.memmove_gbps is None else f"{r.memmove_gbps:.2f}",
         "-" if r.gather_scatter_ratio is None else f"{r.gather_scatter_ratio:.2f}")
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in table:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller jobs, fewer rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CPU, plus CUDA when available")  # fmt: skip
    parser.add_argument("--layers", type=int, default=8, help="layers (default 8)")
    parser.add_argument("--rounds", type=int, help="timed pairs per case (default 9, quick 5)")
    modes = ",".join(COPY_MODES)
    parser.add_argument("--cuda-copy", default=modes,
                        help=f"CUDA worker copy modes to measure (default {modes})")  # fmt: skip
    parser.add_argument("-o", "--output", help="also write the JSON object to this file")
    args = parser.parse_args(argv)
    cuda_modes = tuple(m.strip() for m in args.cuda_copy.split(",") if m.strip())
    bad = [m for m in cuda_modes if m not in COPY_MODES]
    if bad or not cuda_modes:
        parser.error(f"--cuda-copy: expected modes from {list(COPY_MODES)}, got {args.cuda_copy!r}")
    rounds = args.rounds or (5 if args.quick else 9)
    devices = []
    if args.device in ("auto", "cpu"):
        devices.append(torch.device("cpu"))
    if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            parser.error("--device cuda: CUDA is not available")
        devices.append(torch.device("cuda"))
    started = time.perf_counter()
    rows: list[Row] = []
    for device in devices:
        job_mib = (64 if args.quick else 256) * (4 if device.type == "cuda" else 1)
        for tokens in (16, 512):
            rows += _run_case(device, tokens, args.layers, job_mib << 20, rounds, cuda_modes)
    header: dict[str, object] = {
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "layers": args.layers,
        "rounds": rounds,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if torch.cuda.is_available() and any(d.type == "cuda" for d in devices):
        header["gpu"] = torch.cuda.get_device_name()
    report = {"header": header, "rows": [asdict(r) for r in rows]}
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(report, handle, indent=2)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_table(rows, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
