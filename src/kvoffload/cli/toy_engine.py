"""The engine of ``kvoffload demo`` (needs PyTorch): real KV bytes through a CPU tier,
every loaded block checked.

A toy engine: random-looking KV tensors shaped like a small model's cache, a generated
prefix-sharing workload (:mod:`kvoffload.sim.workloads`, token lengths scaled down so the
demo runs in seconds), and :class:`~kvoffload.offloader.KVOffloader` in between.
For each request the engine looks up its prefix, loads the hit blocks into freshly shuffled
device blocks and compares every loaded byte with what that block's KV must be, "computes"
(writes) the missed blocks, and offloads them. The content of a block is a pure function of
its id, so a block loaded from the wrong slot, layer or offset cannot pass.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from kvoffload.cli.errors import UserError
from kvoffload.layout import HostSlotLayout, KVCacheLayout, dtype_name
from kvoffload.offloader import KVOffloader
from kvoffload.sim.records import Trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload
from kvoffload.transfer.views import block_views

_ODD = 0x9E3779B97F4A7C15 - (1 << 64)  # odd, as a signed int64: id * _ODD is unique mod 2**64


def demo_workload(seed: int, requests: int, block_tokens: int) -> WorkloadConfig:
    """The generator's default mix with token lengths divided by ~10: same sharing, small."""
    return WorkloadConfig(
        seed=seed,
        requests=requests,
        block_tokens=block_tokens,
        system_prompt_tokens=400,
        user_tokens=150,
        answer_tokens=80,
        document_tokens=1500,
        agent_prompt_tokens=600,
        tool_tokens=90,
    )


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"--device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: CUDA is not available")
    return device


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UserError(f"--dtype: torch has no dtype {name!r}")
    return dtype


def _kv_caches(args: argparse.Namespace, num_blocks: int) -> list[torch.Tensor]:
    shapes = {
        "kv_first": (2, num_blocks, args.block_tokens, args.kv_heads, args.head_size),
        "blocks_first": (num_blocks, 2, args.block_tokens, args.kv_heads, args.head_size),
        "mla": (num_blocks, args.block_tokens, args.kv_heads * args.head_size),
        "heads_first": (2, args.kv_heads, num_blocks, args.block_tokens, args.head_size),
    }
    device, dtype = _device(args.device), _dtype(args.dtype)
    return [torch.zeros(shapes[args.kind], dtype=dtype, device=device) for _ in range(args.layers)]


class ToyKVContent:
    """The KV a block must hold: a random page per layer view, plus the block id times an odd
    constant in every 8-byte lane, so two blocks differ in every lane and nothing is stored."""

    def __init__(
        self, layout: KVCacheLayout, kv_caches: list[torch.Tensor], slot_layout: HostSlotLayout
    ) -> None:
        self.views = [v for views in block_views(layout, kv_caches, slot_layout) for v in views]
        self.device = kv_caches[0].device
        self.word = self.views[0].dtype
        generator = torch.Generator().manual_seed(1234)
        self.base = []
        for view in self.views:
            page_bytes = view.shape[1] * view.element_size()
            lanes = torch.randint(
                -(2**63), 2**63 - 1, (-(-page_bytes // 8),), generator=generator, dtype=torch.int64
            )
            self.base.append(lanes.to(self.device))

    def expected(self, block_ids: list[int], view: int) -> torch.Tensor:
        """``(len(block_ids), page_words)`` content of ``block_ids`` in one view."""
        ids = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        lanes = self.base[view][None, :] + ids[:, None] * _ODD
        page_bytes = self.views[view].shape[1] * self.views[view].element_size()
        return lanes.view(torch.uint8)[:, :page_bytes].view(self.word)

    def write(self, device_blocks: list[int], block_ids: list[int]) -> None:
        """Stand in for the model's prefill: put each block's KV into its device block."""
        if not device_blocks:
            return
        index = torch.tensor(device_blocks, dtype=torch.int64, device=self.device)
        for v, view in enumerate(self.views):
            view.index_copy_(0, index, self.expected(block_ids, v))

    def mismatches(self, device_blocks: list[int], block_ids: list[int]) -> int:
        """Loaded blocks whose bytes differ from their expected content in any view."""
        if not device_blocks:
            return 0
        index = torch.tensor(device_blocks, dtype=torch.int64, device=self.device)
        bad = torch.zeros(len(device_blocks), dtype=torch.bool, device=self.device)
        for v, view in enumerate(self.views):
            bad |= (view.index_select(0, index) != self.expected(block_ids, v)).any(dim=1)
        return int(bad.sum().item())


def _full_blocks(trace: Trace, index: int) -> list[int]:
    request = trace.requests[index]
    ids = request.block_ids
    return ids[:-1] if request.has_partial_tail(trace.block_tokens) else list(ids)


def _tier_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``tiers`` config of the demo's options: disk first, then Redis."""
    tiers: list[dict[str, Any]] = []
    if args.disk:
        tiers.append(
            {
                "type": "disk",
                "path": args.disk,
                "capacity_bytes": args.disk_bytes,
                "policy": args.disk_policy,
                "durability": args.durability,
                "write_policy": args.write_policy,
            }
        )
    if args.redis:
        tiers.append(
            {
                "type": "redis",
                "url": args.redis,
                "namespace": args.redis_namespace or "kvoffload-demo",
                "prefix": "kvoffload-demo",
                "ttl_ms": 3600 * 1000,  # the demo's records leave the server within an hour
                "lookup": "sync",  # a lookup waits (up to its deadline) for the server
                "write_policy": args.write_policy,
            }
        )
    return tiers


def _gbps(nbytes: float, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3) if seconds else 0.0


def _tier_rows(stats: Any, offloader_stats: Any) -> dict[str, dict[str, Any]]:
    """Per tier: hits, blocks and bytes moved, bandwidth (bytes / job seconds)."""
    rows: dict[str, dict[str, Any]] = {}
    tiers = getattr(stats, "tiers", {}) if stats is not None else {}
    promoted = sum(int(t["promotions"]) for t in tiers.values())
    rows["cpu"] = {
        "hit_blocks": offloader_stats.hit_blocks,
        "promoted_in_blocks": promoted,
        "loaded_bytes": offloader_stats.loaded_bytes,
        "load_gbps": round(offloader_stats.load_gbps, 3),
        "stored_bytes": offloader_stats.stored_bytes,
        "store_gbps": round(offloader_stats.store_gbps, 3),
        "evictions": stats.evictions if stats is not None else 0,
    }
    for label, t in tiers.items():
        rows[label] = {
            "lookups": int(t["lookups"]),
            "hits": int(t["hits"]),
            "promoted_blocks": int(t["promotions"]),
            "failed_reads": int(t["promotion_failures"]),
            "bytes_read": int(t["bytes_read"]),
            "read_gbps": _gbps(t["bytes_read"], t["read_seconds"]),
            "blocks_written": int(t["blocks_written"]),
            "bytes_written": int(t["bytes_written"]),
            "write_gbps": _gbps(t["bytes_written"], t["write_seconds"]),
            "dropped_blocks": int(t["dropped_blocks"]),
            "evictions": int(t.get("medium_evictions", t["tier_evictions"])),
            "corrupt_records": int(t.get("medium_corrupt_records", 0)),
            "breaker": t["breaker_state"],
        }
    return rows


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One engine: the workload through KVOffloader; the summary (``loaded_blocks_wrong`` > 0
    means a loaded block had the wrong bytes)."""
    trace = generate_workload(demo_workload(args.seed, args.requests, args.block_tokens))
    requests = [_full_blocks(trace, i) for i in range(len(trace.requests))]
    num_device_blocks = max(max((len(r) for r in requests), default=1), 1)
    kv = _kv_caches(args, num_device_blocks)
    layout = KVCacheLayout.from_tensors(kv, args.kind)
    generator = torch.Generator().manual_seed(args.seed)
    checked = wrong = from_elsewhere = 0
    stored_here: set[int] = set()  # blocks this process computed and offered to store
    tiers = _tier_configs(args)
    started = time.perf_counter()
    try:
        offloader = KVOffloader(
            kv,
            cpu_bytes=int(args.cpu_mib * (1 << 20)),
            policy=args.policy,
            layout=layout,
            blocks_per_chunk=args.blocks_per_chunk,
            tiers=tiers,
        )
    except (ConnectionError, OSError, ValueError, TypeError) as exc:
        # The options built this config: a bad --disk path or budget is bad input here.
        raise UserError(f"cannot open the tiers: {exc}") from None
    with offloader:
        content = ToyKVContent(layout, kv, offloader.spec.slot_layout)
        for i, block_ids in enumerate(requests):
            hashes = [b.to_bytes(8, "big") for b in block_ids]
            device = torch.randperm(num_device_blocks, generator=generator)[: len(block_ids)]
            device_blocks = device.tolist()
            ctx = offloader.begin_request(trace.requests[i].req_id)
            hit = offloader.lookup(hashes, ctx=ctx)
            if hit:
                offloader.load(hashes[:hit], device_blocks[:hit], ctx=ctx)
                wrong += content.mismatches(device_blocks[:hit], block_ids[:hit])
                checked += hit
                from_elsewhere += sum(b not in stored_here for b in block_ids[:hit])
            content.write(device_blocks[hit:], block_ids[hit:])
            offloader.store(hashes[hit:], device_blocks[hit:], ctx=ctx)
            stored_here.update(block_ids[hit:])
            offloader.end_request(ctx)
        offloader.flush()  # the tiers' writes land before the numbers are read
        stats = offloader.stats()
        slot_layout = offloader.spec.slot_layout
        num_slots = offloader.spec.num_slots  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - started
    summary: dict[str, Any] = {
        "device": str(kv[0].device),
        "dtype": dtype_name(kv[0].dtype),
        "layout": args.kind,
        "layers": args.layers,
        "device_blocks": num_device_blocks,
        "blocks_per_chunk": args.blocks_per_chunk,
        "slot_bytes": slot_layout.slot_bytes,
        "cpu_slots": num_slots,
        "policy": args.policy,
        "requests": len(requests),
        "looked_up_blocks": stats.lookup_blocks,
        "hit_blocks": stats.hit_blocks,
        "hit_ratio": round(stats.hit_ratio, 4),
        "hits_not_stored_here": from_elsewhere,
        "loaded_blocks_verified": checked,
        "loaded_blocks_wrong": wrong,
        "stored_bytes": stats.stored_bytes,
        "loaded_bytes": stats.loaded_bytes,
        "store_gbps": round(stats.store_gbps, 3),
        "load_gbps": round(stats.load_gbps, 3),
        "failed_transfers": stats.failed_loads + stats.failed_stores,
        "stores_without_room": stats.stores_without_room,
        "evictions": stats.manager.evictions if stats.manager else 0,
        "wall_seconds": round(elapsed, 3),
    }
    if tiers:
        summary["tiers"] = _tier_rows(stats.manager, stats)
    return summary


def _instance(args: dict[str, Any], index: int, out: Any) -> None:
    """A child engine process: run, send back the summary (or the error's text)."""
    try:
        out.put((index, run_one(argparse.Namespace(**args)), ""))
    except Exception as exc:  # reported by the parent, which sets the exit status
        out.put((index, {}, f"{type(exc).__name__}: {exc}"))


def run_instances(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--instances N``: N engine processes, one after another, on one shared Redis."""
    import multiprocessing
    import uuid

    # Never a plain fork: the parent may have run kernels on an OpenMP pool, which a forked
    # child can deadlock on. A fork server that imported PyTorch once (and ran nothing)
    # starts each engine in a fraction of a second; spawn where there is none.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if "forkserver" in methods:
        multiprocessing.set_forkserver_preload(["torch", __name__])
    shared = dict(vars(args))
    shared.pop("func", None)
    shared["redis_namespace"] = args.redis_namespace or f"demo-{uuid.uuid4().hex[:12]}"
    shared["instances"] = 1
    summaries: list[dict[str, Any]] = []
    for index in range(args.instances):
        queue = ctx.Queue()
        proc = ctx.Process(target=_instance, args=(shared, index, queue), daemon=True)
        proc.start()
        try:
            _, summary, error = queue.get(timeout=600)
        finally:
            proc.join(timeout=60)
        if error:
            raise UserError(f"instance {index + 1}: {error}")
        summary = {"instance": index + 1, "pid": proc.pid, **summary}
        summaries.append(summary)
    return summaries


def _print_table(summary: dict[str, Any], title: str) -> None:
    flat = {k: v for k, v in summary.items() if k != "tiers"}
    width = max(len(k) for k in flat)
    print(title)
    for key, value in flat.items():
        shown = f"{value:,}" if type(value) is int else value
        print(f"  {key.ljust(width)}  {shown}")
    wrong = summary["loaded_blocks_wrong"]
    verdict = "OK" if wrong == 0 else f"FAILED: {wrong} loaded blocks had wrong bytes"
    print(f"  {'verification'.ljust(width)}  {verdict}")
    tiers = summary.get("tiers")
    if tiers:
        metrics = sorted({m for row in tiers.values() for m in row}, key=_column_order)
        labels = list(tiers)
        print("  per tier (bandwidth: bytes / job seconds, GB/s):")
        cells = [["", *labels]] + [
            [m, *[_cell(tiers[t].get(m, "-")) for t in labels]] for m in metrics
        ]
        widths = [max(len(r[i]) for r in cells) for i in range(len(labels) + 1)]
        for row in cells:
            print(
                "    "
                + row[0].ljust(widths[0])
                + "  "
                + "  ".join(v.rjust(w) for v, w in zip(row[1:], widths[1:], strict=True))
            )


_ORDER = (
    "hit_blocks", "lookups", "hits", "promoted_in_blocks", "promoted_blocks", "failed_reads",
    "loaded_bytes", "load_gbps", "bytes_read", "read_gbps", "stored_bytes", "store_gbps",
    "blocks_written", "bytes_written", "write_gbps", "dropped_blocks", "evictions",
    "corrupt_records", "breaker",
)  # fmt: skip


def _column_order(name: str) -> int:
    return _ORDER.index(name) if name in _ORDER else len(_ORDER)


def _cell(value: Any) -> str:
    return f"{value:,}" if type(value) is int else str(value)


def _ok(summary: dict[str, Any]) -> bool:
    return summary["loaded_blocks_wrong"] == 0 and summary["failed_transfers"] == 0


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit status 1 if any loaded block was wrong."""
    if args.instances > 1:
        summaries = run_instances(args)
        if args.format == "json":
            json.dump({"instances": summaries}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            for s in summaries:
                _print_table(
                    s,
                    f"kvoffload demo, instance {s['instance']} of {len(summaries)} "
                    f"(pid {s['pid']}): hits_not_stored_here came from the earlier instances",
                )
        return 0 if all(_ok(s) for s in summaries) else 1
    summary = run_one(args)
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(
            summary, "kvoffload demo: real KV copies through the tiers, every loaded block verified"
        )
    return 0 if _ok(summary) else 1


__all__ = ["ToyKVContent", "demo_workload", "run", "run_instances", "run_one"]
