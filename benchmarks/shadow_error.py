"""Shadow estimation error: SHARDS-sampled miniature vs full simulation, per policy and capacity.

For every built-in (``auto`` excepted) and each capacity (% of the trace's unique blocks), the
trace's block accesses (one per block, request order) are fed to a ``ShadowEvaluator`` at the
given sample rate (no minimum miniature size) and compared with the full block-level
simulation of the same policy at the full capacity (the miniatures' own protocol: no pinning),
and with the full prefix-mode replay's prefix hit ratio. The error is absolute.

    python benchmarks/shadow_error.py [--trace PATH] [--rate 0.01] [--capacities 1,5,10,25]
    python benchmarks/shadow_error.py --generated 30000 --capacities 1,5,25

The shared trace is short: a 1% sample of its 121,877 accesses is about 1,200, and at hit
ratios of 0.2-0.4 the binomial spread of that many alone is about 0.012. ``--generated N``
runs the same comparison on the generator's default workload of ``N`` requests (seed 1)
instead. ``--salts N`` shows how much of the error is the luck of the draw: each cell's
shadow is run ``N`` times, on the keys with a salt byte appended (salt 0: the keys as they
are), so each run samples a different 1% of the keys, and the signed errors are printed.
Both estimators are shown: the corrected one the evaluator reports (``hit_ratios``; see
``kvoffload.selection.shadow``) and the uncorrected hits over sampled accesses.

    python benchmarks/shadow_error.py --generated 30000 --capacities 1,5,25 \
        --policies lru,mq,kvaware --salts 6
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.selection.shadow import ShadowEvaluator
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import make_context, replay
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload
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
    parser.add_argument(
        "--generated", type=int, default=0, help="use a generated workload of this many requests"
    )
    parser.add_argument("--salts", type=int, default=0, help="the spread over N key samples")
    args = parser.parse_args(argv)
    if args.generated > 0:
        trace = generate_workload(WorkloadConfig(seed=1, requests=args.generated))
        label = f"generated seed=1 requests={args.generated}"
    else:
        trace = load_trace(args.trace)
        label = args.trace.name
    percents = [float(p) for p in args.capacities.split(",") if p.strip()]
    policies = [p for p in args.policies.split(",") if p] or [
        row[0] for row in BUILTIN_POLICIES if row[0] != "auto"
    ]
    keys = [[int_key(b) for b in r.block_ids] for r in trace.requests]
    print(f"{label}: {trace.block_accesses} block accesses, sample rate {args.rate}")
    if args.salts > 0:
        return _spread(trace, keys, percents, policies, args.rate, args.salts)
    print(
        f"{'policy':<11} {'cap':>4} {'shadow':>7} {'full':>7} {'err':>7} {'prefix':>7} {'err':>7}"
        f"  {'uncorr':>7} {'err':>7}"
    )
    worst = worst_plain = 0.0
    over: list[str] = []
    over_plain = 0
    cells = 0
    for percent in percents:
        capacity = max(1, int(trace.num_unique_blocks * percent / 100))
        for name in policies:
            shadow = ShadowEvaluator(capacity, [name], sample_rate=args.rate)
            full = ShadowEvaluator(capacity, [name], sample_rate=1.0)
            _feed(shadow, trace, keys)
            _feed(full, trace, keys)
            est = shadow.hit_ratios()[name]
            plain = shadow.sample_hit_ratios()[name]
            exact = full.hit_ratios()[name]
            prefix = replay(trace, capacity, name).prefix_hit_ratio
            err = abs(est - exact)
            worst = max(worst, err)
            worst_plain = max(worst_plain, abs(plain - exact))
            over_plain += abs(plain - exact) > 0.01
            cells += 1
            if err > 0.01:
                over.append(f"{name}@{percent:g}%")
            print(
                f"{name:<11} {percent:>3g}% {est:7.4f} {exact:7.4f} {err:7.4f} "
                f"{prefix:7.4f} {abs(est - prefix):7.4f}  {plain:7.4f} {abs(plain - exact):7.4f}",
                flush=True,
            )
    within = cells - len(over)
    print(
        f"within 0.01 in {within} of {cells} cells ({shadow.accesses} sampled accesses); "
        f"uncorrected (hits / sampled accesses): {cells - over_plain} of {cells}"
    )
    print(
        f"worst |shadow - full|: {worst:.4f} (uncorrected {worst_plain:.4f}); "
        f"above 0.01: {', '.join(over) or 'none'}"
    )
    return 0


def _feed(evaluator: ShadowEvaluator, trace: Trace, keys: list[list[bytes]]) -> None:
    for request, ks in zip(trace.requests, keys, strict=True):
        ctx = make_context(request, ks, trace.block_tokens)
        evaluator.record(list(dict.fromkeys(ks)), ctx)
        ctx.output_tokens = request.output_tokens
        evaluator.request_finished(ctx)


def _spread(
    trace: Trace,
    keys: list[list[bytes]],
    percents: list[float],
    policies: list[str],
    rate: float,
    salts: int,
) -> int:
    """Each cell's signed errors (estimate - full) on ``salts`` different samples of the keys:
    the corrected estimate, then the uncorrected one (hits / sampled accesses)."""
    salted = [keys] + [[[k + bytes([s]) for k in ks] for ks in keys] for s in range(1, salts)]
    print(f"{'policy':<11} {'cap':>4} {'full':>7}  signed errors, salt 0..{salts - 1}")
    totals = [0, 0, 0]  # cells x salts, within 0.01 corrected, within 0.01 uncorrected
    for percent in percents:
        capacity = max(1, int(trace.num_unique_blocks * percent / 100))
        for name in policies:
            full = ShadowEvaluator(capacity, [name], sample_rate=1.0)
            _feed(full, trace, keys)
            exact = full.hit_ratios()[name]
            corrected, plain = [], []
            for salted_keys in salted:
                shadow = ShadowEvaluator(capacity, [name], sample_rate=rate)
                _feed(shadow, trace, salted_keys)
                corrected.append(shadow.hit_ratios()[name] - exact)
                plain.append(shadow.sample_hit_ratios()[name] - exact)
            for label, errors in (("corrected", corrected), ("uncorrected", plain)):
                print(
                    f"{name if label == 'corrected' else '':<11} "
                    f"{f'{percent:g}%' if label == 'corrected' else '':>4} "
                    f"{f'{exact:.4f}' if label == 'corrected' else '':>7}  "
                    + " ".join(f"{e:+.4f}" for e in errors)
                    + f"  max {max(map(abs, errors)):.4f} {label}",
                    flush=True,
                )
            totals[0] += salts
            totals[1] += sum(abs(e) <= 0.01 for e in corrected)
            totals[2] += sum(abs(e) <= 0.01 for e in plain)
    print(
        f"within 0.01: corrected {totals[1]} of {totals[0]}, uncorrected {totals[2]} of "
        f"{totals[0]} (cells x samples)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
