"""Shadow estimation error: SHARDS-sampled miniature vs full simulation, per policy and capacity.

For every built-in (``auto`` excepted) and each capacity (% of the trace's unique blocks), the
trace's block accesses (one per block, request order) are fed to a ``ShadowEvaluator`` at the
given sample rate (no minimum miniature size) and compared with the full block-level
simulation of the same policy at the full capacity (the miniatures' own protocol: no pinning),
and with the full prefix-mode replay's prefix hit ratio. The error is absolute.

    python benchmarks/shadow_error.py [--trace PATH] [--rate 0.01] [--capacities 1,5,10,25]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.policies.shadow import ShadowEvaluator
from kvoffload.sim.replay import make_context, replay
from kvoffload.sim.traces import load_trace
from kvoffload.testing.drive import int_key

DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake_synthetic_trace.jsonl"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--capacities", default="1,5,10,25")
    parser.add_argument("--policies", default="")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    percents = [float(p) for p in args.capacities.split(",") if p.strip()]
    policies = [p for p in args.policies.split(",") if p] or [
        row[0] for row in BUILTIN_POLICIES if row[0] != "auto"
    ]
    keys = [[int_key(b) for b in r.block_ids] for r in trace.requests]
    print(f"{args.trace.name}: sample rate {args.rate}")
    print(
        f"{'policy':<11} {'cap':>4} {'shadow':>7} {'full':>7} {'err':>7} {'prefix':>7} {'err':>7}"
    )
    worst = 0.0
    over = []
    for percent in percents:
        capacity = max(1, int(trace.num_unique_blocks * percent / 100))
        for name in policies:
            shadow = ShadowEvaluator(capacity, [name], sample_rate=args.rate)
            full = ShadowEvaluator(capacity, [name], sample_rate=1.0)
            for request, ks in zip(trace.requests, keys, strict=True):
                for evaluator in (shadow, full):
                    ctx = make_context(request, ks, trace.block_tokens)
                    evaluator.record(list(dict.fromkeys(ks)), ctx)
                    ctx.output_tokens = request.output_tokens
                    evaluator.request_finished(ctx)
            est = shadow.hit_ratios()[name]
            exact = full.hit_ratios()[name]
            prefix = replay(trace, capacity, name).prefix_hit_ratio
            err = abs(est - exact)
            worst = max(worst, err)
            if err > 0.01:
                over.append(f"{name}@{percent:g}%")
            print(
                f"{name:<11} {percent:>3g}% {est:7.4f} {exact:7.4f} {err:7.4f} "
                f"{prefix:7.4f} {abs(est - prefix):7.4f}",
                flush=True,
            )
    print(f"worst |shadow - full|: {worst:.4f}; above 0.01: {', '.join(over) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
