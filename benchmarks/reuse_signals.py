"""Which per-block signals predict reuse? Odds of reuse within H requests, by signal, on a trace.

For every block access of a Mooncake-format trace (default: the shared synthetic trace), the
table says how often that block is accessed again within the next ``--horizon`` requests,
grouped by the block's use count so far (0, 1, 2, 3+) and one more signal an engine has at call
time: its depth in the request's prefix chain (log2 buckets of its position) or, with
``--by quarter``, which quarter of the request it sits in and whether it is the last block.
A signal worth learning moves the odds within a row; a flat row says it adds nothing beyond
the use count. Offline analysis (it reads the future), not a policy.

    python benchmarks/reuse_signals.py [--trace PATH] [--horizon 300] [--by depth|quarter]
"""

from __future__ import annotations

import argparse
import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from kvoffload.sim.traces import load_trace
from kvoffload.testing.traces import shared_trace_path

DEFAULT_TRACE = shared_trace_path(Path(__file__).resolve().parents[1])  # or $KVOFFLOAD_TRACE
MIN_COUNT = 200  # cells with fewer accesses are not printed (too noisy to read)


def reuse_table(
    requests: Sequence[Sequence[int]], horizon: int, by: str
) -> dict[tuple[int, str], tuple[int, int]]:
    """(uses so far, signal) -> (accesses, accesses followed by a reuse within ``horizon``)."""
    uses: defaultdict[int, list[int]] = defaultdict(list)
    for index, block_ids in enumerate(requests):
        for block_id in block_ids:
            uses[block_id].append(index)
    seen: Counter[int] = Counter()
    cells: defaultdict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0])
    for index, block_ids in enumerate(requests):
        length = len(block_ids)
        for position, block_id in enumerate(block_ids):
            later = uses[block_id]
            nxt = bisect.bisect_right(later, index)
            reused = nxt < len(later) and later[nxt] - index <= horizon
            if by == "depth":
                low = (1 << position.bit_length()) >> 1  # positions low .. 2 low - 1
                signal = str(low) if low < 2 else f"{low}-{2 * low - 1}"
            else:
                signal = "last" if position == length - 1 else f"q{4 * position // length + 1}"
            cell = cells[(min(seen[block_id], 3), signal)]
            cell[0] += 1
            cell[1] += reused
            seen[block_id] += 1
    return {key: (total, hits) for key, (total, hits) in cells.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--horizon", type=int, default=300, help="in requests (default 300)")
    parser.add_argument("--by", choices=("depth", "quarter"), default="depth")
    args = parser.parse_args(argv)
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace)")
    if args.horizon < 1:
        parser.error(f"--horizon must be >= 1, got {args.horizon}")
    trace = load_trace(args.trace)
    table = reuse_table([r.block_ids for r in trace.requests], args.horizon, args.by)
    signals = sorted({s for _, s in table}, key=lambda s: (len(s), s))
    what = "position in the request" if args.by == "depth" else "quarter of the request"
    print(f"{args.trace.name}: P(reused within {args.horizon} requests)")
    print(f"rows: uses so far; columns: {what} (blank: fewer than {MIN_COUNT} accesses)")
    header = f"{'uses':<6}" + "".join(f"{s:>12}" for s in signals)
    print(header + "\n" + "-" * len(header))
    for used in range(4):
        cells = []
        for signal in signals:
            total, hits = table.get((used, signal), (0, 0))
            cells.append(f"{hits / total:>12.3f}" if total >= MIN_COUNT else " " * 12)
        print(f"{str(used) + ('+' if used == 3 else ''):<6}" + "".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
