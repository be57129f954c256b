"""Per-block cost of every built-in policy in the manager replay, as a ratio to ``lru``'s.

Each policy replays a Mooncake-format trace (default: the shared synthetic trace) through our
``CPUOffloadingManager`` with the call sequence of ``compare_vllm.py``; runs are interleaved
with an ``lru`` run each time, and the ratio is the median of the per-pair ratios, so the
machine's load affects both sides of each ratio alike.

    python benchmarks/policy_cost.py --capacity 5% --runs 3
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import build_keys, load_ours, load_replay_trace, make_contexts, replay_parser
from compare_vllm import replay as replay_trace
from kvoffload.policies import BUILTIN_POLICIES


def main(argv: Sequence[str] | None = None) -> int:
    parser = replay_parser(__doc__.split("\n\n")[0], runs=3)
    parser.add_argument("--policies", default="", help="comma-separated (default: all built-ins)")
    args = parser.parse_args(argv)
    trace, capacity = load_replay_trace(parser, args)
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
