"""Our CPUOffloadingManager against vLLM's, side by side on one trace, in one process.

Each request of a Mooncake-format trace goes through the call sequence of vLLM's offloading
connector scheduler, with the same policy, capacity and keys for both managers:

    on_new_request; lookup each key until the first non-HIT; prepare_load + complete_load of
    the hit prefix; prepare_store + complete_store of the rest; on_request_finished.

Printed per policy: prefix hit ratio (hits / block accesses) and ns per block of each manager,
and the speed ratio vLLM ns / ours ns (> 1 means ours is faster). Each replay is timed whole
with ``perf_counter_ns``; ours and vLLM's run interleaved, ``--runs`` times each. Times are
medians; the ratio is the median of the per-run ratios (each pair ran back to back). The trace
is parsed and the keys built before timing, once per library; each replay's request contexts
(with the keys' token positions, as vLLM's scheduler records them) are built before its timer.

vLLM is optional: without it only our manager runs, with a note. See benchmarks/README.md for
the environment (``tools/setup_vllm_env.sh``) in which vLLM's manager imports on a CPU.

    python benchmarks/compare_vllm.py
    python benchmarks/compare_vllm.py --policies lru,arc --capacity 5% --runs 5 --format json
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvoffload.sim.capacity import CAPACITY_HELP, parse_capacity
from kvoffload.sim.traces import load_trace
from kvoffload.testing.traces import shared_trace_path

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = shared_trace_path(Path(__file__).resolve().parents[1])  # or $KVOFFLOAD_TRACE
VLLM_MANAGER_MODULE = "vllm.v1.kv_offload.cpu.manager"


@dataclass
class Library:
    """What a replay needs from one library: its manager, context, key maker and HIT value."""

    name: str
    version: str
    manager_cls: Callable[..., Any]
    context_cls: Callable[..., Any]
    make_key: Callable[[bytes, int], bytes]
    hit: Any


@dataclass
class Result:
    """One library's replays of one policy: hit count (must not vary) and per-run times."""

    hits: int = 0
    ns: list[int] = field(default_factory=list)
    varying_hits: set[int] = field(default_factory=set)


def load_ours() -> Library:
    """Our manager, context, key maker (the package under test)."""
    import kvoffload
    from kvoffload.context import ReqContext
    from kvoffload.keys import make_offload_key
    from kvoffload.manager import CPUOffloadingManager, LookupResult

    return Library(
        "kvoffload",
        kvoffload.__version__,
        CPUOffloadingManager,
        ReqContext,
        make_offload_key,
        LookupResult.HIT,
    )


def load_vllm() -> tuple[Library | None, str]:
    """vLLM's manager when importable here, else ``None`` and why (the import takes seconds)."""
    try:
        vllm = importlib.import_module("vllm")
        manager_module = importlib.import_module(VLLM_MANAGER_MODULE)
        base = importlib.import_module("vllm.v1.kv_offload.base")
    except ImportError as exc:
        return None, (
            f"vLLM's {VLLM_MANAGER_MODULE} is not importable here ({exc}); "
            "build the environment with tools/setup_vllm_env.sh (see benchmarks/README.md)"
        )
    return (
        Library(
            "vllm",
            getattr(vllm, "__version__", "?"),
            manager_module.CPUOffloadingManager,
            base.ReqContext,
            base.make_offload_key,
            base.LookupResult.HIT,
        ),
        "",
    )


def build_keys(lib: Library, requests: Sequence[Sequence[int]]) -> list[list[bytes]]:
    """Per request, each block id as 8 big-endian bytes plus group 0, via ``lib``'s key maker.

    Equal block ids give one shared ``bytes`` object, as an engine's block-hash cache would.
    """
    make_key = lib.make_key
    cache: dict[int, bytes] = {}
    out: list[list[bytes]] = []
    for block_ids in requests:
        keys = []
        for block_id in block_ids:
            key = cache.get(block_id)
            if key is None:
                key = cache[block_id] = make_key(block_id.to_bytes(8, "big"), 0)
            keys.append(key)
        out.append(keys)
    return out


def make_contexts(
    lib: Library, requests: list[list[bytes]], block_tokens: int, positions: bool
) -> list[Any]:
    """One fresh context per request, built before timing (not the manager's cost).

    With ``positions`` each key's end-token position is recorded, as vLLM's scheduler does;
    vLLM's LRU orders a request's keys by them.
    """
    contexts = []
    for index, keys in enumerate(requests):
        ctx = lib.context_cls(req_id=str(index))
        if positions:
            for i, key in enumerate(keys):
                ctx.set_offload_key_position(key, (i + 1) * block_tokens)
        contexts.append(ctx)
    return contexts


def replay(
    lib: Library, policy: str, capacity: int, requests: list[list[bytes]], contexts: list[Any]
) -> tuple[int, int]:
    """Drive one fresh manager through every request; return (prefix hits, elapsed ns)."""
    manager = lib.manager_cls(capacity, cache_policy=policy)
    hit = lib.hit
    lookup = manager.lookup
    hits = 0
    gc.collect()
    start = time.perf_counter_ns()
    for keys, ctx in zip(requests, contexts, strict=True):
        manager.on_new_request(ctx)
        n = 0
        for key in keys:
            if lookup(key, ctx) is not hit:
                break
            n += 1
        if n:
            loaded = keys[:n]
            manager.prepare_load(loaded, ctx)
            manager.complete_load(loaded, ctx)
            hits += n
        if n < len(keys):
            output = manager.prepare_store(keys[n:], ctx)
            if output is not None and output.keys_to_store:
                manager.complete_store(output.keys_to_store, ctx)
        manager.on_request_finished(ctx)
    elapsed = time.perf_counter_ns() - start
    return hits, elapsed


def replay_parser(description: str, runs: int) -> argparse.ArgumentParser:
    """The ``--trace`` / ``--capacity`` / ``--runs`` options every replay benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", default="5%")
    parser.add_argument("--runs", type=int, default=runs)
    return parser


def load_replay_trace(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Any, int]:
    """The parsed ``--trace`` and its ``--capacity`` in blocks (a parser error if missing)."""
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace or set KVOFFLOAD_TRACE)")
    trace = load_trace(args.trace)
    capacity = parse_capacity(args.capacity, trace.num_unique_blocks, trace.block_tokens).blocks
    return trace, capacity


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Parse, build keys, replay interleaved; return the report as a JSON-ready dict."""
    trace = load_trace(args.trace, max_requests=args.limit)
    block_ids = [r.block_ids for r in trace.requests]
    accesses = trace.block_accesses
    try:
        capacity = parse_capacity(args.capacity, trace.num_unique_blocks, trace.block_tokens)
    except ValueError as exc:
        raise SystemExit(f"--capacity: {exc}") from exc
    capacity_blocks = capacity.blocks
    if capacity_blocks < 1:
        raise SystemExit(f"--capacity '{args.capacity}' is {capacity_blocks} blocks; need >= 1")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]

    libs = [load_ours()]
    note = "vLLM skipped (--no-vllm)"
    if not args.no_vllm:
        vllm_lib, note = load_vllm()
        if vllm_lib is not None:
            libs.append(vllm_lib)
    keys = {lib.name: build_keys(lib, block_ids) for lib in libs}
    for lib in libs[1:]:
        if keys[lib.name] != keys[libs[0].name]:
            raise SystemExit(f"{lib.name} builds different key bytes than {libs[0].name}")

    rows = []
    for policy in policies:
        row: dict[str, Any] = {"policy": policy}
        runnable = []
        for lib in libs:
            try:  # vLLM knows only its own built-ins (and out-of-tree classes)
                lib.manager_cls(1, cache_policy=policy)
                runnable.append(lib)
            except (ValueError, ImportError, AttributeError) as exc:
                if lib is libs[0]:
                    raise SystemExit(f"policy '{policy}': {exc}") from exc
                row[lib.name] = {"error": str(exc)}
        results = {lib.name: Result() for lib in runnable}
        for run_index in range(args.runs):
            for lib in runnable:  # interleaved: ours, vLLM, ours, vLLM, ...
                contexts = make_contexts(
                    lib, keys[lib.name], trace.block_tokens, not args.no_positions
                )
                hits, ns = replay(lib, policy, capacity_blocks, keys[lib.name], contexts)
                result = results[lib.name]
                if run_index == 0:
                    result.hits = hits
                elif hits != result.hits:
                    result.varying_hits.add(hits)
                result.ns.append(ns)
        for lib in runnable:
            result = results[lib.name]
            row[lib.name] = {
                "hits": result.hits,
                "hit_ratio": result.hits / accesses,
                "ns_per_block": statistics.median(result.ns) / accesses,
                "ns_per_block_runs": [ns / accesses for ns in result.ns],
                "varying_hits": sorted(result.varying_hits),
            }
        if "vllm" in results:
            ours, theirs = row["kvoffload"], row["vllm"]
            # Each run's pair ran back to back, so it saw the same machine load: the median of
            # the per-pair ratios is steadier than the ratio of the medians on a shared machine.
            ours_ns, vllm_ns = results["kvoffload"].ns, results["vllm"].ns
            pair_ratios = [v / o for o, v in zip(ours_ns, vllm_ns, strict=True)]
            row["speed_ratio"] = statistics.median(pair_ratios)
            row["speed_ratio_runs"] = pair_ratios
            row["speed_ratio_of_medians"] = theirs["ns_per_block"] / ours["ns_per_block"]
            row["hit_ratio_diff"] = ours["hit_ratio"] - theirs["hit_ratio"]
        rows.append(row)

    return {
        "trace": str(args.trace),
        "requests": len(trace.requests),
        "block_accesses": accesses,
        "unique_blocks": trace.num_unique_blocks,
        "capacity": args.capacity,
        "capacity_blocks": capacity_blocks,
        "runs": args.runs,
        "positions": not args.no_positions,
        "python": sys.version.split()[0],
        "versions": {lib.name: lib.version for lib in libs},
        "note": "" if len(libs) > 1 else note,
        "results": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    versions = ", ".join(f"{name} {v}" for name, v in report["versions"].items())
    lines = [
        f"trace: {report['trace']}",
        f"{report['requests']} requests, {report['block_accesses']} block accesses, "
        f"{report['unique_blocks']} unique blocks; capacity {report['capacity']} = "
        f"{report['capacity_blocks']} blocks; median of {report['runs']} runs; "
        f"key positions {'recorded' if report['positions'] else 'not recorded'}",
        f"{versions}; Python {report['python']}",
    ]
    with_vllm = "vllm" in report["versions"]
    if with_vllm:
        header = (
            f"{'policy':<8} {'hit ours':>9} {'hit vLLM':>9} {'ns/blk ours':>12} "
            f"{'ns/blk vLLM':>12} {'vLLM/ours':>10}"
        )
    else:
        header = f"{'policy':<8} {'hit ours':>9} {'ns/blk ours':>12}"
    lines += ["", header, "-" * len(header)]
    for row in report["results"]:
        ours = row["kvoffload"]
        if with_vllm and "error" in row["vllm"]:
            lines.append(
                f"{row['policy']:<8} {ours['hit_ratio']:>9.4f} {'n/a':>9} "
                f"{ours['ns_per_block']:>12.0f} {'n/a':>12} {'n/a':>10}"
            )
        elif with_vllm:
            theirs = row["vllm"]
            lines.append(
                f"{row['policy']:<8} {ours['hit_ratio']:>9.4f} {theirs['hit_ratio']:>9.4f} "
                f"{ours['ns_per_block']:>12.0f} {theirs['ns_per_block']:>12.0f} "
                f"{row['speed_ratio']:>9.2f}x"
            )
        else:
            lines.append(
                f"{row['policy']:<8} {ours['hit_ratio']:>9.4f} {ours['ns_per_block']:>12.0f}"
            )
        for name in report["versions"]:
            if "error" in row[name]:
                lines.append(f"  {name} cannot run '{row['policy']}': {row[name]['error']}")
            elif row[name]["varying_hits"]:
                lines.append(f"  warning: {name} hit counts varied across runs")
    if report["note"]:
        lines += ["", f"note: {report['note']}"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake-format JSONL")
    parser.add_argument("--capacity", default="5%", help=CAPACITY_HELP + " (one value)")
    parser.add_argument("--policies", default="lru,arc", help="comma-separated policy names")
    parser.add_argument("--runs", type=int, default=5, help="replays per library and policy")
    parser.add_argument("--limit", type=int, default=None, help="replay the first N requests")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--no-vllm", action="store_true", help="run our manager only")
    parser.add_argument(
        "--no-positions",
        action="store_true",
        help="do not record keys' token positions in the request contexts (vLLM's scheduler "
        "records them; vLLM's LRU uses them to order a request's keys)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace or set KVOFFLOAD_TRACE)")
    report = run(args)
    print(json.dumps(report, indent=2) if args.format == "json" else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
