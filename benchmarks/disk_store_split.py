"""Disk tier stores against plain writes, store only, with user and system CPU apart.

``disk_tier_bandwidth.py`` times a store inside a run that also reads, rescans and truncates
the previous run's plain file; on a shared virtual machine a single buffered write of the
same bytes there moves several times between runs, so its median store ratio says more about
which run met a slow kernel path than about the tier. This script isolates the store: each
round writes ``--total-mib`` of slot bytes once with one ``os.write`` per block to a new file
and once through a new ``DiskTier`` (jobs of ``--batch`` keys, drained), alternating which
goes first, and unlinks both outside the timed part. Per side and round it takes wall seconds
and the process's user and system CPU seconds (``getrusage``: every thread, so the tier's I/O
threads too). It reports medians and the median of the per-round ratios (plain wall over tier
wall), so a round where one side hit a slow path counts once, not as the figure, and the CPU
seconds of the checksum alone over the same blocks (read from memory, as the tier meets
them). System CPU is the kernel's copy into the page cache, the same bytes on both sides;
user CPU is what the tier adds (its index and policy, header encoding, checksums, thread
hand-offs).

Two more sides in each round bound where a gap comes from: ``layout``, the tier's file
layout written with nothing else (a 4 KiB header page before each block, one vectored write
per run of ``--batch`` records, one thread), and ``layout+sum``, the same with each block of
a run checksummed first, as the tier does. Their ratios to the plain write are the columns
``layout`` and ``+sum``: what the layout costs, and what the checksum adds to it; the rest
of the tier's gap is its machinery (jobs, threads, index, policy). The four sides take
turns going first.

    python benchmarks/disk_store_split.py
    python benchmarks/disk_store_split.py --block-kib 64,2048 --threads 1,4 --rounds 9
    python benchmarks/disk_store_split.py --block-kib 64,2048 --threads 4 --put-lanes 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from disk_tier_bandwidth import _keys, _memory
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.disk import DiskTier
from kvoffload.tiers.disk.records import HEADER_BYTES, checksum_function, resolve_checksum

Sample = tuple[float, float, float]  # wall, user, system seconds


def _usage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def _timed_file(path: str, write: Callable[[int], None]) -> Sample:
    """Wall, user and system seconds of creating ``path`` and ``write(fd)`` into it; the
    file is removed after, outside the timed part."""
    u0, s0 = _usage()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    write(fd)
    os.close(fd)
    wall = time.perf_counter() - t0
    u1, s1 = _usage()
    os.unlink(path)
    return wall, u1 - u0, s1 - s0


def _plain(memory: BytearraySlotMemory, blocks: int, path: str) -> Sample:
    views = [memory.slot_view(b) for b in range(blocks)]

    def write(fd: int) -> None:
        for view in views:
            os.write(fd, view)

    return _timed_file(path, write)


def _bare(
    memory: BytearraySlotMemory,
    blocks: int,
    path: str,
    batch: int,
    checksum: Callable[[memoryview], int] | None,
) -> Sample:
    """The tier's file layout written with nothing else: per run of ``batch`` records one
    vectored write of (4 KiB header page, block) pairs, in one thread; with ``checksum``,
    each block of the run hashed first, as the tier does before its write."""
    views = [memory.slot_view(b) for b in range(blocks)]
    header = memoryview(bytearray(HEADER_BYTES))

    def write(fd: int) -> None:
        for start in range(0, blocks, batch):
            run = views[start : start + batch]
            if checksum is not None:
                for view in run:
                    checksum(view)
            os.writev(fd, [part for view in run for part in (header, view)])

    return _timed_file(path, write)


def _tier(
    memory: BytearraySlotMemory,
    blocks: int,
    root: str,
    args: argparse.Namespace,
    threads: int,
    salt: int,
) -> Sample:
    capacity = 2 * blocks * (HEADER_BYTES + memory.slot_bytes)
    # only when asked: a source tree from before put lanes has no such keyword
    lanes = {} if args.put_lanes == "auto" else {"put_lanes": int(args.put_lanes)}
    tier = DiskTier(
        memory,
        root,
        capacity,
        durability=args.durability,
        checksum=args.checksum,
        io_threads=threads,
        **lanes,  # type: ignore[arg-type]
    )
    keys = _keys(blocks, salt)
    batch = args.batch
    u0, s0 = _usage()
    t0 = time.perf_counter()
    for start in range(0, blocks, batch):
        tier.submit_put(keys[start : start + batch], list(range(start, min(blocks, start + batch))))
    if not tier.drain(600):
        raise RuntimeError("puts did not finish within 600 s")
    wall = time.perf_counter() - t0
    u1, s1 = _usage()
    failed = [r.reasons for r in tier.poll() if not r.all_ok]
    tier.close()
    shutil.rmtree(root)
    if failed:
        raise RuntimeError(f"a put failed: {failed[:3]}")
    return wall, u1 - u0, s1 - s0


def _case(args: argparse.Namespace, base: str, block_kib: int, threads: int) -> dict[str, object]:
    slot_bytes = block_kib << 10
    blocks = max(8, (args.total_mib << 20) // slot_bytes)
    memory = _memory(slot_bytes, blocks)
    checksum = checksum_function(resolve_checksum(args.checksum))
    assert checksum is not None
    sides: dict[str, Callable[[int], Sample]] = {
        "plain": lambda k: _plain(memory, blocks, os.path.join(base, f"plain{k}.bin")),
        "layout": lambda k: _bare(
            memory, blocks, os.path.join(base, f"layout{k}.bin"), args.batch, None
        ),
        "layout_checksum": lambda k: _bare(
            memory, blocks, os.path.join(base, f"summed{k}.bin"), args.batch, checksum
        ),
        "tier": lambda k: _tier(
            memory, blocks, os.path.join(base, f"tier{k}"), args, threads, k + 1
        ),
    }
    names = list(sides)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    loads = []
    for k in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name in names[k % len(names) :] + names[: k % len(names)]:  # each goes first in turn
            samples[name].append(sides[name](k))
    plain, tier = samples["plain"], samples["tier"]

    def medians(samples: list[Sample]) -> dict[str, float]:
        return {
            name: statistics.median(s[i] for s in samples)
            for i, name in enumerate(("wall_s", "user_s", "sys_s"))
        }

    pairs = list(zip(plain, tier, strict=True))
    # the tier's checksum pass alone over the same blocks, as it meets them: 256 MiB does
    # not fit the CPU caches, so this reads memory (the cache-hot rate is several times it)
    c0 = time.process_time()
    for b in range(blocks):
        checksum(memory.slot_view(b))
    checksum_s = time.process_time() - c0
    return {
        "block_kib": block_kib,
        "blocks": blocks,
        "threads": threads,
        **{name: medians(samples[name]) for name in names},
        "layout_ratio": statistics.median(p[0] for p in plain)
        / statistics.median(x[0] for x in samples["layout"]),
        "layout_checksum_ratio": statistics.median(p[0] for p in plain)
        / statistics.median(x[0] for x in samples["layout_checksum"]),
        "ratio_of_medians": statistics.median(p[0] for p in plain)
        / statistics.median(t[0] for t in tier),
        "median_round_ratio": statistics.median(p[0] / t[0] for p, t in pairs),
        "round_ratios": [round(p[0] / t[0], 3) for p, t in pairs],
        "plain_rounds": [[round(x, 4) for x in p] for p in plain],  # wall, user, sys
        "tier_rounds": [[round(x, 4) for x in t] for t in tier],
        "checksum_cpu_s": checksum_s,
        "load_average": statistics.median(loads),
    }


def _positive_ints(parser: argparse.ArgumentParser, option: str, text: str) -> list[int]:
    """``text``'s comma-separated whole numbers, each at least 1 (else a usage error)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        parser.error(f"{option} takes whole numbers separated by commas, got {text!r}")
    if any(value < 1 for value in values):
        parser.error(f"{option} values must be at least 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--durability", default="rename", choices=["none", "rename", "fsync"])
    parser.add_argument("--checksum", default="xxh3")
    parser.add_argument("--total-mib", type=int, default=256, help="bytes per round (MiB)")
    parser.add_argument("--block-kib", default="2048,64", help="block sizes, comma-separated")
    parser.add_argument("--threads", default="4,1", help="tier I/O threads, comma-separated")
    parser.add_argument("--batch", type=int, default=16, help="keys per job")
    parser.add_argument(
        "--put-lanes",
        default="auto",
        help="put tasks the tier runs at once: a number, or auto (the tier's own choice)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--format", default="table", choices=["table", "json"])
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.total_mib < 1 or args.batch < 1:
        parser.error("--rounds, --total-mib and --batch must be at least 1")
    block_sizes = _positive_ints(parser, "--block-kib", args.block_kib)
    thread_counts = _positive_ints(parser, "--threads", args.threads)
    if args.put_lanes != "auto":
        (lanes,) = _positive_ints(parser, "--put-lanes", args.put_lanes)
        if lanes > min(thread_counts):
            parser.error("--put-lanes must not exceed any --threads value")
    base = tempfile.mkdtemp(prefix="kvoff-store-split-", dir=args.dir)
    rows = []
    try:
        for block_kib in block_sizes:
            for threads in thread_counts:
                rows.append(_case(args, base, block_kib, threads))
                print(f"done: {block_kib} KiB, {threads} threads", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"{args.total_mib} MiB per round, {args.rounds} rounds, durability={args.durability}, "
        f"checksum={args.checksum}, batch={args.batch}, put lanes={args.put_lanes}; "
        "seconds are medians per round"
    )
    print(
        f"{'block':>8} {'threads':>7} {'plain wall/user/sys':>21} {'tier wall/user/sys':>21} "
        f"{'ratio':>6} {'round ratio':>11} {'checksum s':>10} {'layout':>6} {'+sum':>6} "
        f"{'load':>5}"
    )
    for row in rows:
        p, t = row["plain"], row["tier"]
        assert isinstance(p, dict) and isinstance(t, dict)
        print(
            f"{row['block_kib']:>6}Ki {row['threads']:>7} "
            f"{p['wall_s']:7.3f}/{p['user_s']:.3f}/{p['sys_s']:.3f} "
            f"{t['wall_s']:7.3f}/{t['user_s']:.3f}/{t['sys_s']:.3f} "
            f"{row['ratio_of_medians']:>6.2f} {row['median_round_ratio']:>11.2f} "
            f"{row['checksum_cpu_s']:>10.4f} {row['layout_ratio']:>6.2f} "
            f"{row['layout_checksum_ratio']:>6.2f} {row['load_average']:>5.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
