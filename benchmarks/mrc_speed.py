"""One-pass curves against full replays, on a generated trace of ``--accesses`` block accesses.

What it measures, in one process (CPU seconds beside wall seconds, and the load average: the
machine may be shared):

1. generating the trace (and the peak memory so far, bytes per access);
2. the exact LRU curve over ``--points`` capacities (stack distances), and ``--check``
   of them against full ``replay(..., mode="blocks")`` runs: equal block, prefix and token hits;
3. every built-in policy (but ``auto``) sampled at the seven ``sweep`` capacities, and
   ``--full`` policies at three of them in full (blocks mode): the absolute errors;
4. what ``kvoffload sweep`` of that grid would cost: each policy replayed on the first
   ``--subset`` of the requests and on the first request alone at one capacity; the
   difference gives its CPU time per access, the one-request replay its fixed cost per cell;
   both scaled to the whole trace at seven capacities (a full sweep takes hours here);
5. the peak memory of the whole run.

    python benchmarks/mrc_speed.py --accesses 1e6
    python benchmarks/mrc_speed.py --accesses 1e7 --json out.json
    python benchmarks/mrc_speed.py --trace ../shared/trace.jsonl   # a trace file instead
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.sim.capacity import Capacity, parse_capacities
from kvoffload.sim.mrc import exact_lru_curve, sampled_curve
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec, ReplayOptions, replay
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

SWEEP_CAPACITIES = "1%,2%,5%,10%,20%,30%,50%"
ACCESSES_PER_REQUEST = 23.8  # the default workload's mean, to size the request count


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, fn: Callable[[], Any], out: dict[str, Any]) -> Any:
    cpu, wall = time.process_time(), time.perf_counter()
    value = fn()
    out[label] = {
        "cpu_s": round(time.process_time() - cpu, 2),
        "wall_s": round(time.perf_counter() - wall, 2),
    }
    print(f"{label}: {out[label]['cpu_s']} s CPU, {out[label]['wall_s']} s wall", flush=True)
    return value


def log_capacities(trace: Trace, points: int) -> list[Capacity]:
    unique = trace.num_unique_blocks
    out: dict[int, Capacity] = {}
    for i in range(points):
        share = 0.001 * 1000 ** (i / (points - 1))
        blocks = max(1, round(unique * share))
        out.setdefault(blocks, Capacity(f"{share * 100:.3g}%", blocks))
    return list(out.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--accesses", type=float, default=1e6)
    parser.add_argument("--trace", type=Path, help="a trace file instead of a generated one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--points", type=int, default=50)
    parser.add_argument("--check", type=int, default=5, help="exact capacities checked in full")
    parser.add_argument(
        "--full", default="lru,arc,s3fifo", help="policies checked in full ('': none)"
    )
    parser.add_argument("--full-capacities", default="2%,10%,30%")
    parser.add_argument(
        "--policies",
        help="policies sampled (comma-separated; default every built-in but auto; lru is "
        "added, the control variate needs it)",
    )
    parser.add_argument("--sample-rate", type=float, default=0.01)
    parser.add_argument("--sample-blocks", type=int, default=256)
    parser.add_argument("--salts", type=int, default=2)
    parser.add_argument(
        "--max-sampled-blocks",
        type=int,
        default=None,
        help="SHARDS fixed-size: lower the rate so the draw holds about this many blocks",
    )
    parser.add_argument(
        "--max-blocks", type=int, default=None, help="lower the rate where a miniature is bigger"
    )
    parser.add_argument("--subset", type=float, default=0.02, help="share of requests timed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--parts",
        default="exact,sampled,sweep",
        help="which steps to run after generating (comma-separated: exact, sampled, sweep)",
    )
    args = parser.parse_args()
    out: dict[str, Any] = {"load_average_start": os.getloadavg()}
    print(f"load average {os.getloadavg()}", flush=True)

    if args.trace is not None:
        trace = timed("read", lambda: load_trace(args.trace), out)
    else:
        requests = max(1, round(args.accesses / ACCESSES_PER_REQUEST))
        config = WorkloadConfig(seed=args.seed, requests=requests)
        trace = timed("generate", lambda: generate_workload(config), out)
    n = trace.block_accesses
    out["trace"] = trace.describe()
    out["peak_mb_after_trace"] = round(peak_mb(), 1)
    print(
        f"{trace.source}: {n:,} accesses, {trace.num_unique_blocks:,} unique; peak "
        f"{out['peak_mb_after_trace']} MB ({peak_mb() * 2**20 / n:.0f} bytes per access)",
        flush=True,
    )

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if "exact" in parts:
        exact_part(trace, args, out)
    if "sampled" in parts or "sweep" in parts:
        sampled_part(trace, args, out, parts)
    out["peak_mb"] = round(peak_mb(), 1)
    out["load_average_end"] = os.getloadavg()
    print(f"peak memory {out['peak_mb']} MB; load average {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


def exact_part(trace: Trace, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """The exact LRU curve and ``--check`` of its points against full replays."""
    caps = log_capacities(trace, args.points)
    curve = timed("exact_lru", lambda: exact_lru_curve(trace, caps), out)
    out["exact_points"] = len(caps)
    out["peak_mb_after_exact"] = round(peak_mb(), 1)
    step = max(1, len(caps) // args.check)
    checked = []
    for point in curve.points[step // 2 :: step][: args.check]:
        full = timed(
            f"replay_lru_{point.capacity}",
            lambda point=point: replay(
                trace, point.capacity_blocks, "lru", ReplayOptions("blocks")
            ),
            out,
        )
        equal = (point.block_hits, point.prefix_hit_blocks, point.token_hits) == (
            full.block_hits,
            full.prefix_hit_blocks,
            full.token_hits,
        )
        checked.append(
            {"capacity": point.capacity, "blocks": point.capacity_blocks, "equal": equal}
        )
        print(f"  exact lru @ {point.capacity}: {point.block_hit_ratio:.4f}, equal: {equal}")
    out["exact_checks"] = checked


def sampled_part(
    trace: Trace, args: argparse.Namespace, out: dict[str, Any], parts: set[str]
) -> None:
    """Every built-in sampled, ``--full`` of them checked in full, and the sweep estimate."""
    sweep_caps = parse_capacities(SWEEP_CAPACITIES, trace.num_unique_blocks, trace.block_tokens)
    names = [name for name, *_ in BUILTIN_POLICIES if name != "auto"]
    if args.policies:
        names = list(dict.fromkeys(["lru", *(p for p in args.policies.split(",") if p)]))
    if "sampled" in parts:
        sampled_errors(trace, args, out, names, sweep_caps)
    if "sweep" in parts:
        sweep_estimate(trace, args, out, names, sweep_caps)


def sampled_errors(
    trace: Trace,
    args: argparse.Namespace,
    out: dict[str, Any],
    names: list[str],
    sweep_caps: list[Capacity],
) -> None:
    """Every policy in ``names`` sampled at ``sweep_caps``; ``--full`` ones checked in full.

    Each estimate is also given with LRU as a control variate (``sampled_curve``'s
    ``lru_control``): the sampled LRU's error against the exact curve, subtracted. Its mean
    over the salts is the plain estimates' mean less the sampled LRU's mean error, so it
    comes from the same run (the exact curve at the sweep's capacities is timed apart).
    """
    specs = [PolicySpec(name) for name in names]
    sampled = timed(
        "sampled_all",
        lambda: sampled_curve(
            trace,
            sweep_caps,
            specs,
            "blocks",
            args.sample_rate,
            args.sample_blocks,
            args.salts,
            max_sampled_blocks=args.max_sampled_blocks,
            max_blocks=args.max_blocks,
        ),
        out,
    )
    out["peak_mb_after_sampled"] = round(peak_mb(), 1)
    out["sample_rates"] = {
        p.capacity: p.sample_rate for p in sampled.points if p.policy == sampled.points[0].policy
    }
    estimates = {(p.policy, p.capacity): p for p in sampled.points}
    exact = timed("exact_lru_sweep_capacities", lambda: exact_lru_curve(trace, sweep_caps), out)
    exact_lru = {p.capacity: p.block_hit_ratio for p in exact.points}
    shift = {
        cap.label: estimates[("lru", cap.label)].block_hit_ratio - exact_lru[cap.label]
        for cap in sweep_caps
        if ("lru", cap.label) in estimates
    }
    out["sampled_lru_vs_exact"] = {label: round(value, 4) for label, value in shift.items()}
    print(f"  sampled lru - exact lru: {out['sampled_lru_vs_exact']}", flush=True)
    errors = []
    full_caps = parse_capacities(args.full_capacities, trace.num_unique_blocks, trace.block_tokens)
    for name in [p for p in args.full.split(",") if p]:
        for cap in full_caps:
            full = timed(
                f"replay_{name}_{cap.label}",
                lambda name=name, cap=cap: replay(trace, cap.blocks, name, ReplayOptions("blocks")),
                out,
            )
            point = estimates[(name, cap.label)]  # the full capacities are in the sweep's
            error = point.block_hit_ratio - full.block_hit_ratio
            controlled = error - shift[cap.label]
            errors.append(
                {
                    "policy": name,
                    "capacity": cap.label,
                    "full": round(full.block_hit_ratio, 4),
                    "sampled": round(point.block_hit_ratio, 4),
                    "error": round(error, 4),
                    "error_estimate": point.error_estimate,
                    "rate": point.sample_rate,
                    "within_0.01": abs(error) <= 0.01,
                    "lru_controlled_error": round(controlled, 4),
                    "lru_controlled_within_0.01": abs(controlled) <= 0.01,
                }
            )
            print(
                f"  {name} @ {cap.label}: full {full.block_hit_ratio:.4f} sampled "
                f"{point.block_hit_ratio:.4f} error {error:+.4f} (est ±{point.error_estimate}); "
                f"lru-controlled error {controlled:+.4f}",
                flush=True,
            )
    out["sampled_errors"] = errors


def sweep_estimate(
    trace: Trace,
    args: argparse.Namespace,
    out: dict[str, Any],
    names: list[str],
    sweep_caps: list[Capacity],
) -> None:
    """What ``kvoffload sweep`` of the grid would cost, estimated from replays of a subset."""
    n = trace.block_accesses

    # The sweep of the same grid, estimated: each policy replayed on the first --subset of
    # the requests and on the first request alone; the difference gives its CPU time per
    # access, the one-request replay its fixed cost per cell (the key table of every unique
    # block, the manager), which a sweep pays once per policy and capacity.
    def subset(count: int) -> Trace:
        return Trace(
            trace.requests[:count], trace.block_tokens, trace.num_unique_blocks, trace.source
        )

    part, one = subset(max(2, int(len(trace.requests) * args.subset))), subset(1)
    cap = sweep_caps[3]
    sweep_cpu = 0.0
    for name in names:
        costs = []
        for piece in (part, one):
            cpu = time.process_time()
            replay(piece, cap.blocks, name, ReplayOptions("blocks"))
            costs.append(time.process_time() - cpu)
        per_access = max(0.0, costs[0] - costs[1]) / (part.block_accesses - one.block_accesses)
        sweep_cpu += len(sweep_caps) * (costs[1] + per_access * n)
    mrc_cpu = sum(
        out.get(step, {}).get("cpu_s", 0.0)
        for step in ("sampled_all", "exact_lru", "exact_lru_sweep_capacities")
    )
    out["sweep_estimate"] = {
        "policies": len(names),
        "capacities": len(sweep_caps),
        "subset_accesses": part.block_accesses,
        "estimated_cpu_s": round(sweep_cpu, 1),
        "mrc_cpu_s": mrc_cpu,
        "speedup_cpu": round(sweep_cpu / mrc_cpu, 1),
    }
    print(
        f"sweep of {len(names)} policies x {len(sweep_caps)} capacities, estimated from "
        f"{part.block_accesses:,} accesses each: {sweep_cpu:,.0f} s CPU; sampled + exact "
        f"curves: {mrc_cpu:,.1f} s CPU ({sweep_cpu / mrc_cpu:.1f}x)",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
