"""CPU worker: does ``blocks_per_chunk > 1`` move the same bytes as fast as one block per chunk?

A chunk of ``k`` consecutive device blocks is one contiguous span on the device side and one
in its slot, so the CPU worker copies it (and a run of adjacent chunks) as one strided copy
per layer view. This script times store and load of the same KV bytes (1,024 tokens of a
6-layer, 2-KV-head, head-size-64 fp32 cache: 6 MiB) with one big block per chunk against
small blocks grouped into chunks, fresh-cache mapping (chunk ``i`` = blocks
``[i*k, (i+1)*k)`` into slot ``i``), and the same small-block jobs through the per-block
path (chunk merging off) as the before-figure. The three jobs alternate, ``--reps`` rounds;
medians of wall and CPU seconds (``time.process_time``, every thread of the process) and the
median of the rounds' merged/one-block ratios.

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


class _Case:
    """One worker over its own caches and host slots; ``job(op)`` times one store or load of
    all 1,024 tokens (fresh-cache mapping: chunk ``i`` = blocks ``[i*k, (i+1)*k)`` -> slot i)."""

    def __init__(self, kind: str, block_tokens: int, bpc: int) -> None:
        caches = _caches(kind, block_tokens)
        layout = KVCacheLayout.from_tensors(caches, kind)
        slots = layout.slot_layout(bpc)
        self.chunks = TOKENS // block_tokens // bpc
        host = HostBuffer(slots.slot_bytes, self.chunks, pin=False)
        self.worker = create_transfer_worker(layout, slots, host, caches)
        self.blocks = list(range(self.chunks * bpc))
        self.job_id = 0

    def job(self, op: str) -> tuple[float, float]:
        self.job_id += 1
        slots = list(range(self.chunks))
        wall, cpu = time.perf_counter(), time.process_time()
        if op == "store":
            self.worker.submit_store(self.job_id, self.blocks, slots)
        else:
            self.worker.submit_load(self.job_id, slots, self.blocks)
        self.worker.wait([self.job_id])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert all(r.success for r in self.worker.get_finished())
        return wall, cpu


def _compare(kind: str, big: int, small: int, op: str, reps: int) -> dict[str, float]:
    """Jobs of the three cases alternate, so load on the host hits them alike; each figure is
    a median over ``reps`` rounds, each ratio the median of the rounds' ratios."""
    bpc = big // small
    base, merged, before = _Case(kind, big, 1), _Case(kind, small, bpc), _Case(kind, small, bpc)
    times: dict[str, list[tuple[float, float]]] = {"base": [], "merged": [], "before": []}
    try:
        for _ in range(reps):
            times["base"].append(base.job(op))
            times["merged"].append(merged.job(op))
            with _per_block_path():
                times["before"].append(before.job(op))
    finally:
        for case in (base, merged, before):
            case.worker.shutdown()
    out = {}
    for name, rows in times.items():
        out[f"{name}_ms"] = statistics.median(w for w, _ in rows) * 1e3
        out[f"{name}_cpu_ms"] = statistics.median(c for _, c in rows) * 1e3
    out["ratio_wall"] = statistics.median(
        m[0] / b[0] for m, b in zip(times["merged"], times["base"], strict=True)
    )
    out["ratio_cpu"] = statistics.median(
        m[1] / b[1] for m, b in zip(times["merged"], times["base"], strict=True) if b[1] > 0
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for kind in ("heads_first", "kv_first"):
        for big, small in ((64, 16), (256, 16)):
            for op in ("store", "load"):
                r = _compare(kind, big, small, op, args.reps)
                rows.append(
                    {"kind": kind, "op": op, "case": f"{small}x{big // small} vs {big}x1", **r}
                )
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"load_avg_1m": load, "rows": rows}, indent=2))
        return
    print(f"1k tokens, {LAYERS} layers x {HEADS} heads x {HEAD_SIZE} fp32; medians of "
          f"{args.reps}; ms wall (CPU); load average {load:.1f}")  # fmt: skip
    print("kind         op     case            1 block/chunk   merged chunks   per-block path"
          "   merged/1-block: wall  CPU")  # fmt: skip
    for r in rows:
        print(
            f"{r['kind']:<12} {r['op']:<6} {r['case']:<15} "
            f"{r['base_ms']:6.2f} ({r['base_cpu_ms']:5.2f})  "
            f"{r['merged_ms']:6.2f} ({r['merged_cpu_ms']:5.2f})  "
            f"{r['before_ms']:6.2f} ({r['before_cpu_ms']:5.2f})   "
            f"{r['ratio_wall']:5.2f} {r['ratio_cpu']:5.2f}"
        )


if __name__ == "__main__":
    main()
