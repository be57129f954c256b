"""This tree's manager against another source tree's (say, the commit before a change), in one run.

Loads ``kvoffload`` twice in one process (the other tree first, under ``--base-src``; then
this one), and alternates replays of the shared trace through each: the call sequence of
``compare_vllm.py`` (``prefix``: lookups, load of the hit prefix, store of the rest) and the
simulator's ``blocks`` mode (each version's own ``kvoffload.sim.replay.replay``). Prints each
version's median ns per block and the median of the per-pair ratios new / base (< 1: this
tree is faster; pairs run in ABBA order), and checks that both versions' hit counts are equal.

``--control`` loads this tree a second time (``copy``) and prints copy / new as well: the same
code in two loaded copies, so that ratio is the comparison's noise floor on this machine (a
new / base ratio inside it says nothing).

    git archive HEAD~3 src | tar -x -C /tmp/base
    python tools/ab_versions.py --base-src /tmp/base/src --policies lru,arc --runs 7
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import compare_vllm
from compare_vllm import Library

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DEFAULT_TRACE = HERE.parent.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


def _kvoffload_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n == "kvoffload" or n.startswith("kvoffload.")}


def activate(mods: dict[str, ModuleType]) -> None:
    """Make ``mods`` the kvoffload in ``sys.modules`` (lazy policy loading looks there)."""
    for name in _kvoffload_modules():
        del sys.modules[name]
    sys.modules.update(mods)


def load_version(src: Path, policies: list[str]) -> dict[str, ModuleType]:
    """Import kvoffload from ``src`` (a fresh copy, with ``policies`` loaded); its modules."""
    activate({})
    sys.path.insert(0, str(src))
    try:
        for name in (
            "kvoffload",
            "kvoffload.manager",
            "kvoffload.sim.replay",
            "kvoffload.sim.traces",
        ):
            importlib.import_module(name)
        kv = sys.modules["kvoffload"]
        for policy in policies:
            kv.CPUOffloadingManager(4, cache_policy=policy)  # loads the policy's module
    finally:
        sys.path.remove(str(src))
    return _kvoffload_modules()


def prefix_replay(
    mods: dict[str, ModuleType], policy: str, capacity: int, reqs: list[list[bytes]]
) -> tuple[int, int]:
    """``compare_vllm.py``'s replay (the connector's call sequence) through ``mods``' manager."""
    kv = mods["kvoffload"]
    lib = Library(
        "kvoffload",
        kv.__version__,
        kv.CPUOffloadingManager,
        kv.ReqContext,
        kv.make_offload_key,
        kv.LookupResult.HIT,
    )
    contexts = [kv.ReqContext(req_id=str(i)) for i in range(len(reqs))]
    return compare_vllm.replay(lib, policy, capacity, reqs, contexts)


def blocks_replay(
    mods: dict[str, ModuleType], trace: Any, policy: str, capacity: int
) -> tuple[int, int]:
    rp = mods["kvoffload.sim.replay"]
    start = time.perf_counter_ns()
    result = rp.replay(trace, capacity, rp.PolicySpec(policy), rp.ReplayOptions(mode="blocks"))
    return result.block_hits, time.perf_counter_ns() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-src", type=Path, required=True, help="the other tree's src/")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--policies", default="lru,arc")
    parser.add_argument("--fraction", type=float, default=0.05, help="capacity / unique blocks")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--control", action="store_true", help="also time a second copy of this tree (A/A)"
    )
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    versions = {"base": load_version(args.base_src, policies), "new": load_version(SRC, policies)}
    if args.control:
        versions["copy"] = load_version(SRC, policies)
    orders = list(itertools.permutations(versions))  # two versions: AB, BA (ABBA)
    traces = {}
    for tag, mods in versions.items():
        activate(mods)
        traces[tag] = mods["kvoffload.sim.traces"].load_trace(args.trace)
    trace = traces["new"]
    capacity = int(args.fraction * trace.num_unique_blocks)
    make_key = versions["new"]["kvoffload"].make_offload_key
    reqs = [[make_key(b.to_bytes(8, "big"), 0) for b in r.block_ids] for r in trace.requests]
    accesses = trace.block_accesses
    print(f"{args.trace.name}: capacity {capacity} blocks, {args.runs} interleaved runs")
    control = f" {'copy/new':>9}" if args.control else ""
    print(
        f"{'policy':<8} {'mode':<7} {'base ns/blk':>11} {'new ns/blk':>10} {'new/base':>9}{control}"
    )
    for policy in policies:
        for mode in ("prefix", "blocks"):
            ns: dict[str, list[float]] = {tag: [] for tag in versions}
            hits: dict[str, set[int]] = {tag: set() for tag in versions}
            for run in range(args.runs):
                # ABBA order (every order in turn): whichever version runs later meets a warmer
                # (or a more fragmented) heap; a collection before each replay starts all of
                # them from the same garbage.
                for tag in orders[run % len(orders)]:
                    mods = versions[tag]
                    activate(mods)
                    gc.collect()
                    if mode == "prefix":
                        h, t = prefix_replay(mods, policy, capacity, reqs)
                    else:
                        h, t = blocks_replay(mods, traces[tag], policy, capacity)
                    ns[tag].append(t / accesses)
                    hits[tag].add(h)
            if len(set().union(*hits.values())) != 1:
                raise SystemExit(f"{policy} {mode}: hit counts differ: {hits}")
            ratio = statistics.median(n / b for b, n in zip(ns["base"], ns["new"], strict=True))
            line = (
                f"{policy:<8} {mode:<7} {statistics.median(ns['base']):>11.0f} "
                f"{statistics.median(ns['new']):>10.0f} {ratio:>8.3f}x"
            )
            if args.control:
                noise = statistics.median(c / n for n, c in zip(ns["new"], ns["copy"], strict=True))
                line += f" {noise:>8.3f}x"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
