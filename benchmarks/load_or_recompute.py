"""Issue 29's targets: load or recompute, on the real-model engine, with a slowed tier.

A seeded, randomly initialised Llama built from a config (transformers 5.x; by default 4
layers, hidden 256, 4 heads, 2 KV heads, vocabulary 8,000, fp32, one torch thread) behind
:class:`~kvoffload.integrations.transformers.PrefixCache`. Every request is a shared prefix
(``--prefix-tokens``) plus its own suffix; before each one the CPU tier is reset, so the
prefix's blocks come from the secondary tier: a real :class:`MemoryTier` slowed by
:class:`~kvoffload.testing.slow_tier.SlowMemoryTier` (a latency per job plus bytes over a
bandwidth). Three settings: ``fast`` (0.5 ms, 10 GB/s), ``slow`` (reads slower than
recomputing the prefix) and ``slows`` (fast for the first half of the requests, then slow).
Three modes, each with its own PrefixCache, tier and estimates, on the same prompts, side by
side (each request runs in the three modes in turn, the order rotating):

* ``load``: the decision off (``decide=False``): every hit is read and waited for;
* ``recompute``: no secondary tier: every prompt is prefilled whole;
* ``decide``: the decision on, the prefill speed measured by the integration.

Targets: ``decide``'s median and p90 TTFT within 5% of the better of the other two in every
setting, and strictly better than the worse where they differ by more than 20%; with the
fast tier at most 1% of hit tokens recomputed; the fast tier's estimated prefill seconds
saved within 20% of the measured difference (``recompute`` minus ``decide``, summed). TTFT
is ``PrefixCache.prefill`` (lookup, load, prefill), wall and CPU seconds of this process.

    python benchmarks/load_or_recompute.py            # about a minute on a shared 2-core box
    python benchmarks/load_or_recompute.py --requests 40 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

from kvoffload.integrations.hf_demo import demo_model
from kvoffload.integrations.transformers import PrefixCache

SLOW_TIER = "kvoffload.testing.slow_tier:SlowMemoryTier"
FAST = {"delay_s": 0.0005, "bytes_per_s": 10e9}
MODES = ["load", "recompute", "decide"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _prompts(args: argparse.Namespace) -> list[list[int]]:
    gen = torch.Generator().manual_seed(args.seed + 1)
    prefix = torch.randint(0, args.vocab, (args.prefix_tokens,), generator=gen).tolist()
    return [
        prefix + torch.randint(0, args.vocab, (args.suffix_tokens,), generator=gen).tolist()
        for _ in range(args.requests + 1)
    ]


def _slow(args: argparse.Namespace, block_bytes: int) -> dict[str, float]:
    """A tier whose read of the prefix takes ``--slow-factor`` times its measured prefill."""
    blocks = args.prefix_tokens // args.block_tokens
    target = args.slow_factor * args.prefix_tokens / args.prefill_tokens_per_s
    return {"delay_s": target / 2, "bytes_per_s": blocks * block_bytes / (target / 2)}


def _cache(model: Any, args: argparse.Namespace, mode: str) -> PrefixCache:
    tiers: list[dict[str, Any]] = []
    if mode != "recompute":
        tiers = [{"type": SLOW_TIER, "capacity_bytes": "256MiB", **FAST}]
    extra: dict[str, Any] = {"decide": False} if mode == "load" else {}
    return PrefixCache(
        model,
        64 << 20,
        block_tokens=args.block_tokens,
        max_tokens=args.prefix_tokens + args.suffix_tokens + 64,
        model_id="bench",
        tiers=tiers,
        tier_wait_s=30.0,
        **extra,
    )


def run_setting(
    model: Any, args: argparse.Namespace, prompts: list[list[int]], setting: str
) -> dict[str, dict[str, Any]]:
    """The three modes side by side: request ``i`` runs in each mode in turn (the order
    rotates), so a busy host slows all three alike."""
    caches = {mode: _cache(model, args, mode) for mode in MODES}
    for pc in caches.values():
        pc.prefill(prompts[0])  # the prefix reaches the tier (write-through), at full speed
        pc.offloader.flush()
    slow = _slow(args, args.block_bytes)
    rows: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for i, tokens in enumerate(prompts[1:]):
        slowed = setting == "slow" or (setting == "slows" and i >= args.requests // 2)
        order = MODES[i % 3 :] + MODES[: i % 3]
        for mode in order:
            pc = caches[mode]
            off = pc.offloader
            for tier in getattr(off.manager, "tiers", []):
                for name, value in (slow if slowed else FAST).items():
                    setattr(tier, name, value)
            off.reset()  # the CPU tier forgets; the secondary keeps the prefix
            off.flush()
            wall, cpu = time.perf_counter(), time.process_time()
            result = pc.prefill(tokens, store=False)
            rows[mode].append(
                {
                    "wall": time.perf_counter() - wall,
                    "cpu": time.process_time() - cpu,
                    "hit": result.hit_tokens,
                }
            )
    out = {}
    for mode, pc in caches.items():
        stats = pc.offloader.stats().manager
        tier_row = dict(next(iter(getattr(stats, "tiers", {}).values()), {}))
        tiering = dict(getattr(stats, "tiering", {}) or {})
        pc.close()
        out[mode] = {"rows": rows[mode], "tier": tier_row, "tiering": tiering}
    return out


def summarize(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, res in results.items():
        walls = [r["wall"] for r in res["rows"]]
        cpus = [r["cpu"] for r in res["rows"]]
        out[mode] = {
            "wall_median": statistics.median(walls),
            "wall_p90": _pct(walls, 0.9),
            "cpu_median": statistics.median(cpus),
            "cpu_p90": _pct(cpus, 0.9),
            "wall_sum": sum(walls),
            "walls_ms": [round(1e3 * w, 1) for w in walls],
            "hit_tokens": sum(r["hit"] for r in res["rows"]),
            "recomputed_by_choice": res["tier"].get("blocks_recomputed_by_choice", 0),
            "probes": res["tier"].get("probes", 0),
            "prefill_seconds_saved": res["tier"].get("prefill_seconds_saved", 0.0),
            "tier_load_seconds": res["tier"].get("load_seconds", 0.0),
            "cpu_load_seconds": res["tiering"].get("cpu_load_seconds", 0.0),
        }
    verdicts = {}
    for stat in ("wall_median", "wall_p90", "cpu_median", "cpu_p90"):
        a, b, d = out["load"][stat], out["recompute"][stat], out["decide"][stat]
        better, worse = min(a, b), max(a, b)
        verdicts[stat] = {
            "within_5pct_of_better": d <= 1.05 * better,
            "strictly_better_than_worse": (d < worse) if worse > 1.2 * better else None,
            "decide_over_better": d / better,
        }
    out["verdicts"] = verdicts
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--prefix-tokens", type=int, default=768)
    parser.add_argument("--suffix-tokens", type=int, default=64)
    parser.add_argument("--block-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--settings", nargs="+", default=["fast", "slow", "slows"])
    parser.add_argument("--json", action="store_true")
    cli = parser.parse_args()
    torch.set_num_threads(1)
    args = argparse.Namespace(
        layers=cli.layers, hidden=cli.hidden, heads=4, kv_heads=2, vocab=8000, seed=0,
        max_tokens=4096, requests=cli.requests, prefix_tokens=cli.prefix_tokens,
        suffix_tokens=cli.suffix_tokens, block_tokens=cli.block_tokens,
        slow_factor=cli.slow_factor,
    )  # fmt: skip
    model = demo_model(args)
    prompts = _prompts(args)
    # The slow tier is sized from this machine's measured prefill speed (one cold prefill).
    with torch.inference_mode():
        model(torch.tensor([prompts[0]]))  # warm-up
        began = time.perf_counter()
        model(torch.tensor([prompts[0]]))
        args.prefill_tokens_per_s = len(prompts[0]) / (time.perf_counter() - began)
    head_dim = args.hidden // args.heads
    args.block_bytes = args.layers * 2 * args.kv_heads * args.block_tokens * head_dim * 4
    wall0, cpu0 = time.perf_counter(), time.process_time()
    report: dict[str, Any] = {
        "prefill_tokens_per_s": args.prefill_tokens_per_s,
        "slow_tier": _slow(args, args.block_bytes),
    }
    for setting in cli.settings:
        results = run_setting(model, args, prompts, setting)
        report[setting] = summarize(results, args)
        if setting == "fast":
            hits = report[setting]["load"]["hit_tokens"]
            decided = report[setting]["decide"]["hit_tokens"]
            report[setting]["recomputed_share_of_hits"] = (hits - decided) / hits if hits else 0
            measured = (
                report[setting]["recompute"]["wall_sum"] - report[setting]["decide"]["wall_sum"]
            )
            estimated = report[setting]["decide"]["prefill_seconds_saved"]
            net = (
                estimated
                - report[setting]["decide"]["tier_load_seconds"]
                - report[setting]["decide"]["cpu_load_seconds"]
            )
            report[setting]["saved"] = {
                "measured_s": measured,
                "estimated_s": estimated,
                "estimated_net_s": net,
                "estimate_over_measured": estimated / measured if measured > 0 else None,
            }
    report["bench_wall_s"] = time.perf_counter() - wall0
    report["bench_cpu_s"] = time.process_time() - cpu0
    report["load_avg_1m"] = os.getloadavg()[0]
    if cli.json:
        print(json.dumps(report, indent=1))
        return
    print(
        f"prefill {report['prefill_tokens_per_s']:.0f} tokens/s; slow tier "
        f"{report['slow_tier']}; load average {report['load_avg_1m']:.1f}"
    )
    for setting in cli.settings:
        r = report[setting]
        print(f"{setting}:")
        for mode in ("load", "recompute", "decide"):
            m = r[mode]
            print(
                f"  {mode:<9} TTFT wall median {1e3 * m['wall_median']:7.1f} ms p90 "
                f"{1e3 * m['wall_p90']:7.1f}  CPU median {1e3 * m['cpu_median']:7.1f} p90 "
                f"{1e3 * m['cpu_p90']:7.1f}  hit tokens {m['hit_tokens']:,}  recomputed by "
                f"choice {m['recomputed_by_choice']} blocks, probes {m['probes']}"
            )
        for stat, v in r["verdicts"].items():
            print(
                f"    {stat}: decide/better {v['decide_over_better']:.3f} "
                f"within 5% {v['within_5pct_of_better']}, better than worse "
                f"{v['strictly_better_than_worse']}"
            )
        if "saved" in r:
            print(f"    recomputed share of hits {100 * r['recomputed_share_of_hits']:.2f}%")
            print(f"    seconds saved: {r['saved']}")
    print(f"bench {report['bench_wall_s']:.1f} s wall, {report['bench_cpu_s']:.1f} s CPU")


if __name__ == "__main__":
    main()
