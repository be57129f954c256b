"""The cost of a manager's shadow policies: replay time with and without them, same run.

The shared trace (prefix-mode replay) at each capacity, through ``--policy`` alone and with
``shadow_policies=--shadow`` at ``--rate`` (``shadow_min_blocks`` 256, the manager default),
interleaved ``--runs`` times; prints the median time ratio and each candidate's estimate next
to its own full replay (the same figures ``kvoffload simulate --shadow`` prints).

    python benchmarks/manager_shadow_cost.py [--trace PATH] [--capacity 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from kvoffload.sim.replay import ReplayOptions, replay
from kvoffload.sim.traces import load_trace

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake_synthetic_trace.jsonl"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--shadow", default="mq,kvaware,arc")
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--capacity", type=float, action="append", help="percent (repeatable)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    names = [n for n in args.shadow.split(",") if n]
    shadowed = ReplayOptions(shadow_policies=tuple(names), shadow_sample_rate=args.rate)
    for percent in args.capacity or [5.0]:
        capacity = max(1, int(trace.num_unique_blocks * percent / 100))
        pairs = []
        for _ in range(args.runs):
            with_shadows = replay(trace, capacity, args.policy, shadowed)
            alone = replay(trace, capacity, args.policy)
            pairs.append((with_shadows.elapsed_s, alone.elapsed_s))
        ratio = statistics.median(a / b for a, b in pairs)
        stats = with_shadows.manager_stats
        print(
            f"{trace.source} {percent:g}% ({capacity} blocks): {args.policy} with shadows "
            f"{ratio:.2f}x alone (median of {args.runs}); shadow rate "
            f"{stats['policy_shadow_rate']:.3g}, {int(stats['policy_shadow_accesses'])} "
            "sampled accesses"
        )
        for name in names:
            actual = replay(trace, capacity, name).block_hit_ratio
            estimate = stats[f"policy_shadow_{name}_hit_ratio"]
            print(
                f"  {name:<10} estimated {estimate:.4f}  actual {actual:.4f}  "
                f"error {estimate - actual:+.4f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
