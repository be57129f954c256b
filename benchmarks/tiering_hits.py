"""Prefix hits of a CPU tier alone and with a secondary tier behind it, per write policy.

Replays a Mooncake-format trace (default: the shared synthetic trace) through a vLLM-style
driver: per request, look up the prefix (``lookup_prefix`` on the tiered manager; a request
whose prefix is being promoted waits one scheduler step, at most ``--waits`` times), load the
hits, store the rest, step. The CPU tier holds ``--cpu`` of the trace's unique blocks, the
secondary (an in-memory tier, one poll of latency) ``--tier`` of them. Every loaded slot is
checked against the bytes stored for its key.

    python benchmarks/tiering_hits.py [--trace PATH] [--cpu 0.05] [--tier 0.5] [--policy lru]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from kvoffload.context import ReqContext
from kvoffload.manager import CPUOffloadingManager, LookupResult, OffloadingManager
from kvoffload.testing.drive import int_key
from kvoffload.tiers import BytearraySlotMemory, MemoryTier
from kvoffload.tiers.manager import SecondaryTier, TieringManager

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces"
DEFAULT_TRACE /= "mooncake_synthetic_trace.jsonl"
SLOT = 16


def pattern(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=SLOT).digest()


def drive(
    manager: OffloadingManager, memory: BytearraySlotMemory, trace: list[list[int]], waits: int
) -> tuple[int, int]:
    """(hit blocks, looked-up blocks) of one replay."""
    step = getattr(manager, "step", lambda: 0)
    hits = total = 0
    for r, ids in enumerate(trace):
        keys = [int_key(i) for i in ids]
        ctx = ReqContext(req_id=f"r{r}")
        manager.on_new_request(ctx)
        p = 0
        for _ in range(waits + 1):
            if isinstance(manager, TieringManager):  # the whole prefix in one call
                results = manager.lookup_prefix(keys, ctx)
            else:
                results = []
                for k in keys:
                    results.append(manager.lookup(k, ctx))
                    if results[-1] is not LookupResult.HIT:
                        break
            p = next((i for i, r in enumerate(results) if r is not LookupResult.HIT), len(results))
            if LookupResult.HIT_PENDING not in results:
                break
            step()
        hits += p
        total += len(keys)
        if p:
            spec = manager.prepare_load(keys[:p], ctx)
            for k, slot in zip(keys[:p], spec.block_ids, strict=True):
                if bytes(memory.slot_view(slot)) != pattern(k):
                    raise AssertionError(f"request {r}: a hit returned other bytes")
        rest = list(dict.fromkeys(keys[p:]))
        out = manager.prepare_store(rest, ctx) if rest else None
        if out is not None:
            for k, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
                memory.slot_view(slot)[:] = pattern(k)
            manager.complete_store(out.keys_to_store, ctx)
        if p:
            manager.complete_load(keys[:p], ctx)
        manager.on_request_finished(ctx)
        step()
    return hits, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--cpu", type=float, default=0.05, help="CPU tier, share of unique blocks")
    parser.add_argument("--tier", type=float, default=0.5, help="secondary, share of unique blocks")
    parser.add_argument("--policy", default="lru", help="eviction policy of both tiers")
    parser.add_argument("--waits", type=int, default=2, help="steps a request waits on promotions")
    args = parser.parse_args()
    with args.trace.open() as handle:
        trace = [json.loads(line)["hash_ids"] for line in handle if line.strip()]
    unique = len({i for ids in trace for i in ids})
    cpu_blocks = max(1, int(unique * args.cpu))
    tier_blocks = max(1, int(unique * args.tier))
    print(
        f"{args.trace.name}: {len(trace)} requests, {unique} unique blocks; CPU {cpu_blocks} "
        f"blocks, secondary {tier_blocks} blocks, policy {args.policy}"
    )
    rows: list[tuple[str, Any]] = [("cpu alone", None)]
    rows += [(p, p) for p in ("write_through", "write_back", "selective")]
    print(f"{'config':<14} {'hit ratio':>9} {'promoted':>9} {'written':>8} {'drops':>6} {'s':>6}")
    for label, write_policy in rows:
        memory = BytearraySlotMemory(SLOT, cpu_blocks)
        cpu = CPUOffloadingManager(cpu_blocks, args.policy)
        manager: OffloadingManager = cpu
        tier = None
        if write_policy is not None:
            tier = MemoryTier(memory, tier_blocks * SLOT, args.policy, latency_polls=1)
            manager = TieringManager(cpu, memory, [SecondaryTier(tier, write_policy)])
        start = time.perf_counter()
        hits, total = drive(manager, memory, trace, args.waits)
        seconds = time.perf_counter() - start
        promoted = written = drops = 0
        if isinstance(manager, TieringManager):
            stats = manager.get_stats().tiers[tier.name if tier else ""]
            promoted, written, drops = (
                stats["promotions"],
                stats["blocks_written"],
                stats["dropped_blocks"],
            )
        print(
            f"{label:<14} {hits / total:>9.4f} {promoted:>9} {written:>8} {drops:>6} "
            f"{seconds:>6.2f}"
        )


if __name__ == "__main__":
    main()
