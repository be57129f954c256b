"""Per-block cost of every built-in policy in the manager replay, as a ratio to ``lru``'s.

Each policy replays a Mooncake-format trace (default: the shared synthetic trace) through our
``CPUOffloadingManager`` with the call sequence of ``compare_vllm.py``; runs are interleaved
with an ``lru`` run each time, and the ratio is the median of the per-pair ratios, so the
machine's load affects both sides of each ratio alike.

    python benchmarks/policy_cost.py --capacity 5% --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import DEFAULT_TRACE, build_keys, load_ours, make_contexts
from compare_vllm import replay as replay_trace
from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.sim.capacity import parse_capacity
from kvoffload.sim.traces import load_trace


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", default="5%")
    parser.add_argument("--policies", default="", help="comma-separated (default: all built-ins)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace)")
    trace = load_trace(args.trace)
    capacity = parse_capacity(args.capacity, trace.num_unique_blocks, trace.block_tokens).blocks
    policies = [p.strip() for p in args.policies.split(",") if p.strip()] or [
        row[0] for row in BUILTIN_POLICIES
    ]
    lib = load_ours()
    keys = build_keys(lib, [r.block_ids for r in trace.requests])
    accesses = trace.block_accesses

    def ns_per_block(policy: str) -> float:
        contexts = make_contexts(lib, keys, trace.block_tokens, positions=True)
        _hits, ns = replay_trace(lib, policy, capacity, keys, contexts)
        return ns / accesses

    print(f"{args.trace.name}: capacity {args.capacity} = {capacity} blocks, {args.runs} runs")
    print(f"{'policy':<12} {'ns/blk':>8} {'lru ns/blk':>11} {'vs lru':>7}")
    worst = 0.0
    for policy in policies:
        pairs = [(ns_per_block(policy), ns_per_block("lru")) for _ in range(args.runs)]
        ratio = statistics.median(p / lru for p, lru in pairs)
        worst = max(worst, ratio)
        print(
            f"{policy:<12} {statistics.median(p for p, _ in pairs):>8.0f} "
            f"{statistics.median(lru for _, lru in pairs):>11.0f} {ratio:>6.2f}x"
        )
    print(f"\nworst ratio to lru: {worst:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
