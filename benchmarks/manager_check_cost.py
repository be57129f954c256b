"""What the manager's argument checks cost, next to the replay they guard, in one run.

Replays a Mooncake-format trace (default: the shared synthetic trace) with the call sequence
of ``compare_vllm.py`` through ``CPUOffloadingManager`` and, interleaved with each replay,
times the checks that replay's calls made, on the same key lists, in a bare loop:

* ``thread``: the thread/shutdown check, once per call that changes state
  (``get_ident() != owner``; 5 per request: on_new_request, prepare_load, complete_load,
  prepare_store, complete_store, on_request_finished when they are made);
* ``list``: ``type(keys) is list`` once per call taking keys;
* ``offered``: ``set(keys)`` of a store's offered keys (built up front; the manager used to
  build it only when evicting, so this bounds the extra cost from above);
* ``types``: ``check_key_types`` on the keys a store offers (where new keys enter the cache).

Prints ns per block of the replay and of each check, and the checks' share of the replay
(medians of ``--runs``). Lookups are not checked, so they add nothing.

    python benchmarks/manager_check_cost.py --policies lru,arc --runs 5
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from threading import get_ident

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import build_keys, load_ours, load_replay_trace, make_contexts, replay_parser
from compare_vllm import replay as replay_trace
from kvoffload.manager.keyargs import check_key_types


def check_costs(requests: list[list[bytes]], hit_lengths: list[int]) -> dict[str, int]:
    """ns spent on each check for the calls a replay with these hit lengths makes."""
    owner = get_ident()
    out = {}
    start = time.perf_counter_ns()
    for keys, n in zip(requests, hit_lengths, strict=True):
        calls = 2 + (2 if n else 0) + (2 if n < len(keys) else 0)
        for _ in range(calls):
            if get_ident() != owner:
                raise AssertionError
    out["thread"] = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for keys, n in zip(requests, hit_lengths, strict=True):
        calls = (2 if n else 0) + (2 if n < len(keys) else 0)
        for _ in range(calls):
            if type(keys) is not list:
                raise AssertionError
    out["list"] = time.perf_counter_ns() - start
    stores = [keys[n:] for keys, n in zip(requests, hit_lengths, strict=True) if n < len(keys)]
    start = time.perf_counter_ns()
    for keys in stores:
        if len(set(keys)) != len(keys):
            raise AssertionError
    out["offered"] = time.perf_counter_ns() - start
    start = time.perf_counter_ns()
    for keys in stores:
        check_key_types(keys, "prepare_store")
    out["types"] = time.perf_counter_ns() - start
    return out


def hit_lengths(policy: str, capacity: int, requests: list[list[bytes]]) -> list[int]:
    """Each request's prefix hit length in this replay (the calls it makes depend on it)."""
    from kvoffload import CPUOffloadingManager, LookupResult, ReqContext

    m = CPUOffloadingManager(capacity, cache_policy=policy)
    out = []
    for i, keys in enumerate(requests):
        ctx = ReqContext(req_id=str(i))
        n = 0
        while n < len(keys) and m.lookup(keys[n], ctx) is LookupResult.HIT:
            n += 1
        if n:
            m.prepare_load(keys[:n], ctx)
            m.complete_load(keys[:n], ctx)
        if n < len(keys):
            o = m.prepare_store(keys[n:], ctx)
            if o is not None and o.keys_to_store:
                m.complete_store(o.keys_to_store, ctx)
        out.append(n)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = replay_parser(__doc__.split("\n\n")[0], runs=5)
    parser.add_argument("--policies", default="lru,arc")
    args = parser.parse_args(argv)
    trace, capacity = load_replay_trace(parser, args)
    lib = load_ours()
    keys = build_keys(lib, [r.block_ids for r in trace.requests])
    accesses = trace.block_accesses
    names = ("thread", "list", "offered", "types")
    print(f"{args.trace.name}: capacity {args.capacity} = {capacity} blocks, {args.runs} runs")
    print(f"{'policy':<8} {'replay ns/blk':>13} " + " ".join(f"{n:>8}" for n in names) + "  share")
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        lengths = hit_lengths(policy, capacity, keys)
        replay_ns: list[float] = []
        costs: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.runs):
            contexts = make_contexts(lib, keys, trace.block_tokens, positions=True)
            _hits, ns = replay_trace(lib, policy, capacity, keys, contexts)
            replay_ns.append(ns / accesses)
            for name, value in check_costs(keys, lengths).items():
                costs[name].append(value / accesses)
        replay = statistics.median(replay_ns)
        medians = {n: statistics.median(v) for n, v in costs.items()}
        share = sum(medians.values()) / replay
        print(
            f"{policy:<8} {replay:>13.0f} "
            + " ".join(f"{medians[n]:>8.1f}" for n in names)
            + f"  {share:>5.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
