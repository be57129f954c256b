"""This tree's disk-tier stores against another source tree's, passes taking turns.

Runs ``benchmarks/disk_store_split.py --format json`` once per tree per pass, alternating
which tree goes first (ABBA), each in its own process with that tree's ``src`` first on the
path. Each pass of each tree measures its tier against a plain write in the same process, so
a tree's figure is its store ratio (plain wall over tier wall, the median of that pass's
per-round ratios) and its tier's user CPU per round; the two trees meet the machine's state
in turn. Prints every pass and the medians.

    git archive 6090e4c src | tar -x -C /tmp/base
    python tools/ab_disk_store.py --base-src /tmp/base/src --passes 4 --block-kib 64,2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPLIT = HERE.parent / "benchmarks" / "disk_store_split.py"


def _run(src: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(SPLIT.parent)]))
    cmd = [sys.executable, str(SPLIT), "--format", "json", "--rounds", str(args.rounds)]
    cmd += ["--block-kib", args.block_kib, "--threads", args.threads]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        # a bad --block-kib or --threads, or a failed store: the benchmark says which
        raise SystemExit(f"{SPLIT.name} failed with {src}:\n{done.stderr.strip()}")
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-src", type=Path, required=True, help="the other tree's src/")
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per pass")
    parser.add_argument("--block-kib", default="64,2048")
    parser.add_argument("--threads", default="4")
    args = parser.parse_args(argv)
    if args.passes < 1 or args.rounds < 1:
        parser.error("--passes and --rounds must be at least 1")
    trees = {"base": args.base_src.resolve(), "new": HERE.parent / "src"}
    if not (trees["base"] / "kvoffload").is_dir():
        parser.error(f"--base-src {args.base_src} holds no kvoffload package")
    results: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for p in range(args.passes):
        order = ["base", "new"] if p % 2 == 0 else ["new", "base"]
        for tree in order:
            for row in _run(trees[tree], args):
                case = (tree, int(row["block_kib"]), int(row["threads"]))
                ratio, user = float(row["median_round_ratio"]), float(row["tier"]["user_s"])
                results.setdefault(case, []).append((ratio, user))
                print(
                    f"pass {p} {tree:4s} {case[1]:>5} KiB {case[2]} threads: ratio {ratio:.3f}, "
                    f"tier user {user:.4f} s, load {float(row['load_average']):.1f}",
                    flush=True,
                )
    print("\nmedians over passes (store ratio, tier user CPU s per 256 MiB)")
    for (tree, kib, threads), samples in sorted(results.items(), key=lambda kv: kv[0][1:]):
        ratios = [r for r, _ in samples]
        users = [u for _, u in samples]
        print(
            f"  {kib:>5} KiB {threads} threads {tree:4s}: ratio {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}), user {statistics.median(users):.4f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
