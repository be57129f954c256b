"""CPU worker: does ``blocks_per_chunk > 1`` move the same bytes as fast as one block per chunk?

A chunk of ``k`` consecutive device blocks is one contiguous span on the device side and one
in its slot, so the CPU worker copies it (and a run of adjacent chunks) as one strided copy
per layer view. This script times store and load of the same KV bytes (1,024 tokens of a
6-layer, 2-KV-head, head-size-64 fp32 cache: 6 MiB) with one big block per chunk against
small blocks grouped into chunks, fresh-cache mapping (chunk ``i`` = blocks
``[i*k, (i+1)*k)`` into slot ``i``), and the same small-block jobs through the per-block
path (chunk merging off) as the before-figure. Medians of ``--reps`` jobs, wall and CPU
seconds (``time.process_time``: other work on the host does not inflate it).

    python benchmarks/chunk_copy.py              # ~10 s
    python benchmarks/chunk_copy.py --reps 50 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvoffload.layout import KVCacheLayout
from kvoffload.transfer import cpu_worker
from kvoffload.transfer.factory import create_transfer_worker
from kvoffload.transfer.host import HostBuffer

LAYERS, HEADS, HEAD_SIZE, TOKENS = 6, 2, 64, 1024


def _caches(kind: str, block_tokens: int) -> list[torch.Tensor]:
    blocks = TOKENS // block_tokens
    shape = {
        "heads_first": (2, HEADS, blocks, block_tokens, HEAD_SIZE),
        "kv_first": (2, blocks, block_tokens, HEADS, HEAD_SIZE),
    }[kind]
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen) for _ in range(LAYERS)]


@contextmanager
def _per_block_path() -> Iterator[None]:
    original = cpu_worker.chunk_starts
    cpu_worker.chunk_starts = lambda blocks, bpc: None  # type: ignore[assignment]
    try:
        yield
    finally:
        cpu_worker.chunk_starts = original


def _time(kind: str, block_tokens: int, bpc: int, reps: int) -> dict[str, float]:
    caches = _caches(kind, block_tokens)
    layout = KVCacheLayout.from_tensors(caches, kind)
    slots = layout.slot_layout(bpc)
    chunks = TOKENS // block_tokens // bpc
    host = HostBuffer(slots.slot_bytes, chunks, pin=False)
    worker = create_transfer_worker(layout, slots, host, caches)
    blocks = list(range(chunks * bpc))
    out: dict[str, list[float]] = {
        k: [] for k in ("store_wall", "store_cpu", "load_wall", "load_cpu")
    }
    job = 0
    try:
        for _ in range(reps):
            for kind_, submit in (("store", worker.submit_store), ("load", None)):
                job += 1
                w, c = time.perf_counter(), time.process_time()
                if submit is not None:
                    submit(job, blocks, list(range(chunks)))
                else:
                    worker.submit_load(job, list(range(chunks)), blocks)
                worker.wait([job])
                out[f"{kind_}_wall"].append(time.perf_counter() - w)
                out[f"{kind_}_cpu"].append(time.process_time() - c)
                assert all(r.success for r in worker.get_finished())
    finally:
        worker.shutdown()
    return {k: statistics.median(v) * 1e3 for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for kind in ("heads_first", "kv_first"):
        for big, small in ((64, 16), (256, 16)):
            bpc = big // small
            base = _time(kind, big, 1, args.reps)
            merged = _time(kind, small, bpc, args.reps)
            with _per_block_path():
                before = _time(kind, small, bpc, args.reps)
            for op in ("store", "load"):
                rows.append(
                    {
                        "kind": kind,
                        "op": op,
                        "case": f"{small}x{bpc} vs {big}x1",
                        "one_block_ms": base[f"{op}_wall"],
                        "merged_ms": merged[f"{op}_wall"],
                        "per_block_ms": before[f"{op}_wall"],
                        "one_block_cpu_ms": base[f"{op}_cpu"],
                        "merged_cpu_ms": merged[f"{op}_cpu"],
                        "per_block_cpu_ms": before[f"{op}_cpu"],
                    }
                )
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"load_avg_1m": load, "rows": rows}, indent=2))
        return
    print(f"1k tokens, {LAYERS} layers x {HEADS} heads x {HEAD_SIZE} fp32; medians of "
          f"{args.reps}; ms wall (CPU); load average {load:.1f}")  # fmt: skip
    print("kind         op     case           1 block/chunk   merged chunks   per-block path"
          "   merged/1-block (CPU)")  # fmt: skip
    for r in rows:
        ratio = r["merged_cpu_ms"] / r["one_block_cpu_ms"] if r["one_block_cpu_ms"] else 0.0
        print(
            f"{r['kind']:<12} {r['op']:<6} {r['case']:<14} "
            f"{r['one_block_ms']:6.2f} ({r['one_block_cpu_ms']:5.2f})  "
            f"{r['merged_ms']:6.2f} ({r['merged_cpu_ms']:5.2f})  "
            f"{r['per_block_ms']:6.2f} ({r['per_block_cpu_ms']:5.2f})   {ratio:5.2f}"
        )


if __name__ == "__main__":
    main()
