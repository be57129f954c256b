"""What ``thread_safe=True`` costs: our manager with and without its lock, side by side.

Replays a Mooncake-format trace (default: the shared synthetic trace) with the call sequence
of ``compare_vllm.py`` through ``CPUOffloadingManager(thread_safe=False)`` and
``CPUOffloadingManager(thread_safe=True)``, interleaved, and prints ns per block for both and
their ratio (median of the per-pair ratios, like compare_vllm.py).

    python benchmarks/manager_lock_cost.py --policies lru,arc --runs 5
"""

from __future__ import annotations

import functools
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_vllm import build_keys, load_ours, load_replay_trace, make_contexts, replay_parser
from compare_vllm import replay as replay_trace
from kvoffload.manager import CPUOffloadingManager


def main(argv: Sequence[str] | None = None) -> int:
    parser = replay_parser(__doc__.split("\n\n")[0], runs=5)
    parser.add_argument("--policies", default="lru,arc")
    args = parser.parse_args(argv)
    trace, capacity = load_replay_trace(parser, args)
    plain = load_ours()
    locked = replace(plain, manager_cls=functools.partial(CPUOffloadingManager, thread_safe=True))
    keys = build_keys(plain, [r.block_ids for r in trace.requests])
    accesses = trace.block_accesses
    print(f"{args.trace.name}: capacity {args.capacity} = {capacity} blocks, {args.runs} runs")
    print(f"{'policy':<8} {'ns/blk':>8} {'ns/blk locked':>14} {'locked/plain':>13}")
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        plain_ns, locked_ns = [], []
        for _ in range(args.runs):
            for lib, out in ((plain, plain_ns), (locked, locked_ns)):
                contexts = make_contexts(lib, keys, trace.block_tokens, positions=True)
                _hits, ns = replay_trace(lib, policy, capacity, keys, contexts)
                out.append(ns / accesses)
        ratio = statistics.median(lk / pl for pl, lk in zip(plain_ns, locked_ns, strict=True))
        print(
            f"{policy:<8} {statistics.median(plain_ns):>8.0f} "
            f"{statistics.median(locked_ns):>14.0f} {ratio:>12.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
