"""Disk tier store/load GB/s against a plain sequential write/read of the same bytes, same run.

For each block size the script writes ``--total-mib`` of slot bytes through a ``DiskTier``
(puts in jobs of ``--batch`` keys, all submitted, then drained) and reads them back into other
slots (gets, likewise), and in the same run writes the same bytes with one ``os.write`` per
block to a fresh file and reads them back with ``os.readv`` (what any design that keeps blocks
in one file, as the tier's arena does, can hope for). Both sides start from a fresh file each
run (the tier from a fresh directory) and move the same payload bytes; the tier's 4 KiB header
page per record (and its 64-byte commit stamps) is its own cost, inside its figure. Durability
matches: under ``none`` and ``rename`` neither side syncs (the tier's ``rename`` guarantee
comes from its write order: header, payload, commit stamp in one sequential write per run of
adjacent records, no barrier); under ``fsync`` the plain file is fsynced once at the end while
the tier puts ``fdatasync`` barriers into every run of records (reused headers zeroed,
payloads, stamps), so that ratio measures per-run durability. Ratios are tier / plain; each
figure is the median of ``--runs`` interleaved runs, the two sides taking turns at going first
(``--order alternate``, the default): on this project's virtual machines the side that writes
right after the other has read back and deleted its 256 MiB is often slowed (up to 3-5x in
system time), so a fixed order would charge that to one side (``--order plain-first`` puts
the tier there in every run; ``docs/benchmarks.md`` has both). Reads hit the page cache for
both (the files were just written; dropping caches needs root), so they compare CPU paths:
the tier's header check and checksum per record against plain reads of one file. Beside each
store and plain write figure: its median wall and CPU seconds (``time.process_time``, all the
process's threads) and the median one-minute load average at the runs' starts, since load
from other processes stretches wall time.

Then the restart scan: a fresh ``DiskTier`` over the written directory, records per second
(header pages and commit stamps read and checked; payloads are verified on read, not on scan).

Block geometries (bytes per token = layers x 2 (K, V) x kv heads x head dim x dtype bytes):
``layer``: one Llama-3-8B layer in bf16, 1 x 2 x 8 x 128 x 2 = 4 KiB/token: 512 tokens =
2 MiB, 16 tokens = 64 KiB; ``model``: all of Qwen2.5-0.5B in bf16, 24 x 2 x 2 x 64 x 2 =
12 KiB/token: 512 tokens = 6 MiB, 16 tokens = 192 KiB.

    python benchmarks/disk_tier_bandwidth.py
    python benchmarks/disk_tier_bandwidth.py --dir /mnt/nvme/kv --durability fsync --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass

from kvoffload.keys import make_offload_key
from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.disk import DiskTier
from kvoffload.tiers.disk.records import HEADER_BYTES, xxhash_available

GEOMETRIES = {"layer": 4096, "model": 12288}  # bytes per token
TOKENS = (512, 16)
TARGETS = {512: 0.8, 16: 0.5}


@dataclass
class Case:
    geometry: str
    tokens: int
    slot_bytes: int
    blocks: int


def _memory(slot_bytes: int, blocks: int) -> BytearraySlotMemory:
    """2 x blocks slots (sources, then destinations) of incompressible bytes."""
    memory = BytearraySlotMemory(slot_bytes, 2 * blocks)
    chunk = os.urandom(min(slot_bytes * blocks, 8 << 20))
    view = memoryview(memory.buffer)
    for start in range(0, slot_bytes * blocks, len(chunk)):
        n = min(len(chunk), slot_bytes * blocks - start)
        view[start : start + n] = chunk[:n]
    for b in range(blocks):  # every block distinct
        memory.slot_view(b)[:8] = b.to_bytes(8, "little")
    return memory


def _keys(blocks: int, salt: int) -> list[bytes]:
    return [
        make_offload_key(salt.to_bytes(8, "big") + b.to_bytes(24, "big")) for b in range(blocks)
    ]


def _plain(
    memory: BytearraySlotMemory, blocks: int, path: str, durability: str
) -> tuple[float, float, float]:
    views = [memory.slot_view(b) for b in range(blocks)]
    c0 = time.process_time()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for view in views:
        os.write(fd, view)
    if durability == "fsync":
        os.fsync(fd)
    os.close(fd)
    write_s = time.perf_counter() - t0
    write_cpu = time.process_time() - c0
    dests = [memory.slot_view(blocks + b) for b in range(blocks)]
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    for view in dests:
        os.readv(fd, [view])
    os.close(fd)
    read_s = time.perf_counter() - t0
    os.unlink(path)
    return write_s, read_s, write_cpu


def _tier_run(
    memory: BytearraySlotMemory,
    blocks: int,
    root: str,
    durability: str,
    checksum: str,
    batch: int,
    threads: int,
    salt: int,
) -> tuple[float, float, float, int, float]:
    capacity = 2 * blocks * (HEADER_BYTES + memory.slot_bytes)
    tier = DiskTier(
        memory, root, capacity, durability=durability, checksum=checksum, io_threads=threads
    )
    keys = _keys(blocks, salt)
    c0 = time.process_time()  # every thread of the process: the tier's I/O threads too
    t0 = time.perf_counter()
    for start in range(0, blocks, batch):
        tier.submit_put(keys[start : start + batch], list(range(start, min(blocks, start + batch))))
    if not tier.drain(600):
        raise RuntimeError("puts did not finish")
    write_s = time.perf_counter() - t0
    write_cpu = time.process_time() - c0
    results = tier.poll()
    if not all(r.all_ok for r in results):
        raise RuntimeError(f"a put failed: {[r.reasons for r in results if not r.all_ok][:3]}")
    t0 = time.perf_counter()
    for start in range(0, blocks, batch):
        dest = list(range(blocks + start, blocks + min(blocks, start + batch)))
        tier.submit_get(keys[start : start + batch], dest)
    if not tier.drain(600):
        raise RuntimeError("gets did not finish")
    read_s = time.perf_counter() - t0
    results = tier.poll()
    if not all(r.all_ok for r in results):
        raise RuntimeError("a get failed")
    for b in (0, blocks - 1):
        if bytes(memory.slot_view(b)) != bytes(memory.slot_view(blocks + b)):
            raise RuntimeError("a block came back different")
    tier.close()
    t0 = time.perf_counter()
    fresh = DiskTier(memory, root, capacity, durability=durability)
    scan_s = time.perf_counter() - t0
    scanned = int(fresh.stats()["scanned_records"])
    fresh.close()
    return write_s, read_s, scan_s, scanned, write_cpu


def _checksum_rate(slot_bytes: int) -> dict[str, float]:
    buf = memoryview(os.urandom(slot_bytes))
    rates = {}
    funcs = {"crc32": zlib.crc32}
    if xxhash_available():
        import xxhash

        funcs["xxh3"] = xxhash.xxh3_64_intdigest
    for name, fn in funcs.items():
        reps = max(1, (256 << 20) // slot_bytes)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(buf)
        rates[name] = reps * slot_bytes / (time.perf_counter() - t0) / 1e9
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--durability", default="rename", choices=["none", "rename", "fsync"])
    parser.add_argument("--total-mib", type=int, default=192, help="bytes per case (MiB)")
    parser.add_argument("--geometries", default="layer,model")
    parser.add_argument("--checksums", default="xxh3,crc32" if xxhash_available() else "crc32")
    parser.add_argument("--batch", type=int, default=16, help="keys per job")
    parser.add_argument("--threads", type=int, default=4, help="tier I/O threads")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--order",
        default="alternate",
        choices=["alternate", "plain-first"],
        help="which side runs first in each run: take turns (default) or always the plain one",
    )
    parser.add_argument("--format", default="table", choices=["table", "json"])
    args = parser.parse_args(argv)
    base = tempfile.mkdtemp(prefix="kvoff-disk-bench-", dir=args.dir)
    rows = []
    try:
        for geometry in args.geometries.split(","):
            per_token = GEOMETRIES[geometry]
            for tokens in TOKENS:
                slot_bytes = per_token * tokens
                blocks = max(8, (args.total_mib << 20) // slot_bytes)
                memory = _memory(slot_bytes, blocks)
                plain_w, plain_r, plain_cpu = [], [], []
                tier_w: dict[str, list[float]] = {c: [] for c in args.checksums.split(",")}
                tier_r: dict[str, list[float]] = {c: [] for c in tier_w}
                tier_cpu: dict[str, list[float]] = {c: [] for c in tier_w}
                loads = []
                scan_rates = []
                salt = 0
                for run in range(args.runs):
                    loads.append(os.getloadavg()[0])
                    tier_first = args.order == "alternate" and run % 2 == 1
                    for side in ("tier", "plain") if tier_first else ("plain", "tier"):
                        if side == "plain":
                            w, r, cpu = _plain(
                                memory, blocks, os.path.join(base, "plain.bin"), args.durability
                            )
                            plain_w.append(w)
                            plain_r.append(r)
                            plain_cpu.append(cpu)
                            continue
                        for checksum in tier_w:
                            salt += 1
                            root = os.path.join(base, f"tier{salt}")
                            w, r, scan_s, scanned, cpu = _tier_run(
                                memory,
                                blocks,
                                root,
                                args.durability,
                                checksum,
                                args.batch,
                                args.threads,
                                salt,
                            )
                            shutil.rmtree(root)
                            tier_w[checksum].append(w)
                            tier_r[checksum].append(r)
                            tier_cpu[checksum].append(cpu)
                            scan_rates.append(scanned / scan_s)
                nbytes = slot_bytes * blocks
                pw, pr = statistics.median(plain_w), statistics.median(plain_r)
                row = {
                    "geometry": geometry,
                    "tokens": tokens,
                    "block_bytes": slot_bytes,
                    "blocks": blocks,
                    "durability": args.durability,
                    "plain_write_gbps": nbytes / pw / 1e9,
                    "plain_read_gbps": nbytes / pr / 1e9,
                    "plain_write_cpu_s": statistics.median(plain_cpu),
                    "plain_write_wall_s": pw,
                    "load_average": statistics.median(loads),
                    "scan_blocks_per_s": statistics.median(scan_rates),
                    "target": TARGETS[tokens],
                    "checksum_gbps": _checksum_rate(slot_bytes),
                }
                for checksum in tier_w:
                    tw, tr = (
                        statistics.median(tier_w[checksum]),
                        statistics.median(tier_r[checksum]),
                    )
                    row[f"{checksum}_store_gbps"] = nbytes / tw / 1e9
                    row[f"{checksum}_load_gbps"] = nbytes / tr / 1e9
                    row[f"{checksum}_store_ratio"] = pw / tw
                    row[f"{checksum}_store_wall_s"] = tw
                    row[f"{checksum}_store_cpu_s"] = statistics.median(tier_cpu[checksum])
                    row[f"{checksum}_load_ratio"] = pr / tr
                rows.append(row)
                del memory
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"durability={args.durability} batch={args.batch} threads={args.threads} "
        f"runs={args.runs} (medians; ratio = tier / plain same-run; target = ratio wanted)"
    )
    header = (
        f"{'geometry':8} {'tokens':>6} {'block':>8} {'checksum':8} {'store GB/s':>10} "
        f"{'plain w':>8} {'ratio':>6} {'load GB/s':>9} {'plain r':>8} {'ratio':>6} "
        f"{'target':>6} {'scan blk/s':>10} {'store s wall/cpu':>16} {'plain s wall/cpu':>16} "
        f"{'load':>5}"
    )
    print(header)
    for row in rows:
        for checksum in args.checksums.split(","):
            print(
                f"{row['geometry']:8} {row['tokens']:>6} {row['block_bytes'] // 1024:>6}Ki "
                f"{checksum:8} {row[f'{checksum}_store_gbps']:>10.2f} "
                f"{row['plain_write_gbps']:>8.2f} {row[f'{checksum}_store_ratio']:>6.2f} "
                f"{row[f'{checksum}_load_gbps']:>9.2f} {row['plain_read_gbps']:>8.2f} "
                f"{row[f'{checksum}_load_ratio']:>6.2f} {row['target']:>6.1f} "
                f"{row['scan_blocks_per_s']:>10.0f} "
                f"{row[f'{checksum}_store_wall_s']:>7.3f}/{row[f'{checksum}_store_cpu_s']:<8.3f} "
                f"{row['plain_write_wall_s']:>7.3f}/{row['plain_write_cpu_s']:<8.3f} "
                f"{row['load_average']:>5.1f}"
            )
    rates = {
        f"{r['block_bytes'] // 1024}Ki": {k: round(v, 2) for k, v in r["checksum_gbps"].items()}
        for r in rows
    }
    print(f"checksum speed alone (GB/s, one thread): {rates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
