"""Instructions per manager replay, counted by valgrind: an A/B that noise cannot move.

Timed comparisons here swing by 5-15% between passes (``ab_versions.py --control`` shows the
floor); an instruction count is the same on every run. For each ``--src`` tree this runs, under
``valgrind --tool=callgrind``, one process that loads the trace and replays it 0 times and one
that replays it ``--replays`` times (``compare_vllm.py``'s call sequence: prefix lookups, load,
store), and prints the difference per replay, with each tree's ratio to the first. Instructions
are not time (cache misses and branch costs differ), but a change that adds or removes work
shows in them at the 0.1% level.

    python tools/ab_instructions.py --src /tmp/base/src --src src --policy lru
    python tools/ab_instructions.py --src src --policy wtinylfu --capacity 5%

Needs ``valgrind`` (``apt-get install valgrind``). Each run takes a few minutes (valgrind runs
Python about 50 times slower); the runs go two at a time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = HERE.parent.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
_COLLECTED = re.compile(r"Collected : (\d+)")


def child(src: str, trace: str, capacity: str, policy: str, replays: int) -> None:
    """The measured process: ``replays`` prefix replays of ``trace`` through ``src``'s manager
    (loaded as ``ab_versions.py`` loads a tree, so any older tree works)."""
    sys.path.insert(0, str(HERE))
    from ab_versions import activate, load_version, prefix_replay

    mods = load_version(Path(src), [policy])
    activate(mods)
    loaded = mods["kvoffload.sim.traces"].load_trace(Path(trace))
    parse_capacity = importlib.import_module("kvoffload.sim.capacity").parse_capacity
    blocks = parse_capacity(capacity, loaded.num_unique_blocks, loaded.block_tokens).blocks
    make_key = mods["kvoffload"].make_offload_key
    keys = [[make_key(b.to_bytes(8, "big"), 0) for b in r.block_ids] for r in loaded.requests]
    # Everything loaded so far (both loaded copies of the package, the trace, the keys) out of
    # the collector's sight: a bigger tree's code would otherwise make every full collection
    # during the replays dearer and count as replay work.
    gc.freeze()
    for _ in range(replays):
        hits, _ns = prefix_replay(mods, policy, blocks, keys)
        print(f"hits {hits}")


def count(src: Path, args: argparse.Namespace, replays: int) -> tuple[int, set[str]]:
    """Instructions of one child run, and the hit counts it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={tmp}/out",
            sys.executable,
            __file__,
            "--child",
            str(src.resolve()),
            str(args.trace),
            args.capacity,
            args.policy,
            str(replays),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(
            f"valgrind run failed for {src} ({replays} replays):\n{done.stderr[-2000:]}"
        )
    hits = {line for line in done.stdout.splitlines() if line.startswith("hits ")}
    return int(found.group(1)), hits


def main() -> int:
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, action="append", required=True, help="a src/ tree")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--capacity", default="5%")
    parser.add_argument("--policy", default="lru")
    parser.add_argument("--replays", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    if not args.trace.exists():
        parser.error(f"trace {args.trace} not found (give --trace)")
    if args.replays < 1:
        parser.error("--replays must be >= 1")
    for src in args.src:
        if not (src / "kvoffload" / "__init__.py").exists():
            parser.error(f"{src} holds no kvoffload package")
    jobs = [(src, n) for src in args.src for n in (0, args.replays)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        counts = list(pool.map(lambda job: count(job[0], args, job[1]), jobs))
    results = dict(zip(jobs, counts, strict=True))
    print(f"{args.trace.name}, {args.policy} at {args.capacity}, {args.replays} replays per tree")
    print(f"{'tree':<40} {'instructions/replay':>20} {'vs first':>9}  hits")
    first = None
    for src in args.src:
        (empty, _), (full, hits) = results[(src, 0)], results[(src, args.replays)]
        per_replay = (full - empty) / args.replays
        first = first or per_replay
        print(f"{src!s:<40} {per_replay / 1e6:>19.1f}M {per_replay / first:>8.3f}x  {sorted(hits)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
