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


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit status 1 if any loaded block was wrong."""
    trace = generate_workload(demo_workload(args.seed, args.requests, args.block_tokens))
    requests = [_full_blocks(trace, i) for i in range(len(trace.requests))]
    num_device_blocks = max(max((len(r) for r in requests), default=1), 1)
    kv = _kv_caches(args, num_device_blocks)
    layout = KVCacheLayout.from_tensors(kv, args.kind)
    generator = torch.Generator().manual_seed(args.seed)
    checked = wrong = 0
    started = time.perf_counter()
    with KVOffloader(
        kv,
        cpu_bytes=int(args.cpu_mib * (1 << 20)),
        policy=args.policy,
        layout=layout,
        blocks_per_chunk=args.blocks_per_chunk,
    ) as offloader:
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
            content.write(device_blocks[hit:], block_ids[hit:])
            offloader.store(hashes[hit:], device_blocks[hit:], ctx=ctx)
            offloader.end_request(ctx)
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
    if args.format == "json":
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        width = max(len(k) for k in summary)
        print("kvoffload demo: real KV copies through a CPU tier, every loaded block verified")
        for key, value in summary.items():
            shown = f"{value:,}" if type(value) is int else value
            print(f"  {key.ljust(width)}  {shown}")
        verdict = "OK" if wrong == 0 else f"FAILED: {wrong} loaded blocks had wrong bytes"
        print(f"  {'verification'.ljust(width)}  {verdict}")
    return 0 if wrong == 0 and summary["failed_transfers"] == 0 else 1


__all__ = ["ToyKVContent", "demo_workload", "run"]
