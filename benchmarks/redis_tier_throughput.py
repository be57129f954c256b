"""Redis tier store / load throughput as a ratio of the same server's own ceiling.

For 16-token and 512-token blocks of a Llama-3-8B-shaped KV cache (8 KV heads x 128, fp16, K
and V; ``--layers`` layers per record, default 1: 64 KiB and 2 MiB records), measure:

* **ours**: ``RedisTier.submit_put`` / ``submit_get`` of the blocks in jobs of ``--job``
  blocks, wall time from the first submit to the last result (records built and checksummed,
  ``SET NX PX`` / ``GETEX PX`` pipelined, payloads verified and copied into host slots);
* the **ceiling**: the faster, in each round and for each of put and get, of two raw loops
  sending the same values, 16 commands per pipeline (``redis-benchmark -P 16``'s shape), plain
  ``SET`` then ``GET``, no header, no checksum, no copy into a slot:

  - **redis-py**: a ``pipeline(transaction=False)`` per 16 values;
  - **socket**: hand-framed RESP on a bare socket, each value sent as it lies and each reply
    received straight into one preallocated buffer (``recv_into``): what Python on one
    connection can get out of this server, whichever client library the tier uses.

  Both loops run on as many connections (threads) as the tier has workers (``--workers``), so
  the tier never gets more connections than its ceiling. ``redis-benchmark -t set,get -d
  <bytes> -P 16`` (one connection) is shown too when it is installed, as the server's own figure.

Rounds alternate ceiling and ours (the database is flushed between them); the table shows
the median of the per-round ratios with their spread, and the median GB/s of each loop. A
throwaway ``redis-server`` is started on a free loopback port unless ``--url`` is given.

    python benchmarks/redis_tier_throughput.py            # ~1 min
    python benchmarks/redis_tier_throughput.py --quick --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kvoffload.tiers import BytearraySlotMemory
from kvoffload.tiers.redis import RedisTier

KV_BYTES_PER_TOKEN_LAYER = 2 * 8 * 128 * 2  # K and V, 8 heads x 128, fp16


def start_server() -> tuple[subprocess.Popen[bytes], str, str]:
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed: apt-get install redis-server, or pass --url")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="kvoffload-redis-bench-")
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--maxmemory",
            "0",
            "--proto-max-bulk-len",
            "1gb",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    return proc, url, workdir


def split(count: int, parts: int) -> list[range]:
    """``range(count)`` in ``parts`` contiguous runs (one per connection)."""
    bounds = [count * p // parts for p in range(parts + 1)]
    return [range(bounds[p], bounds[p + 1]) for p in range(parts) if bounds[p] < bounds[p + 1]]


def threaded(parts: list[range], work: Callable[[int, range], None]) -> float:
    """Seconds for ``work(p, part)`` of every part, each in its own thread."""
    threads = [threading.Thread(target=work, args=(p, part)) for p, part in enumerate(parts)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def ceiling_redis_py(url: str, values: list[bytes], connections: int) -> tuple[float, float]:
    """Seconds for pipelined SETs then GETs of ``values`` with redis-py (16 per pipeline)."""
    names = [f"raw:{i}".encode() for i in range(len(values))]
    clients = [redis.Redis.from_url(url) for _ in range(connections)]
    parts = split(len(values), connections)
    got = [0] * len(parts)

    def put(p: int, part: range) -> None:
        for start in range(part.start, part.stop, 16):
            pipe = clients[p].pipeline(transaction=False)
            for i in range(start, min(start + 16, part.stop)):
                pipe.set(names[i], values[i])
            pipe.execute()

    def get(p: int, part: range) -> None:
        for start in range(part.start, part.stop, 16):
            pipe = clients[p].pipeline(transaction=False)
            for i in range(start, min(start + 16, part.stop)):
                pipe.get(names[i])
            got[p] += sum(len(v) for v in pipe.execute())

    try:
        for c in clients:
            c.ping()  # connected before the clock starts, as the tier's pool is
        put_s, get_s = threaded(parts, put), threaded(parts, get)
    finally:
        for c in clients:
            c.close()
    assert sum(got) == sum(len(v) for v in values)
    return put_s, get_s


class RawConnection:
    """A bare RESP connection: commands framed by hand, bulk replies into one buffer.

    Reply lines are read 4 KiB at a time, so most of a value lands straight in the value
    buffer, and a value's CRLF is read together with the next reply's line.
    """

    def __init__(self, url: str, value_bytes: int) -> None:
        parts = urlparse(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray(1 << 16)
        self.lo = self.hi = 0
        self.value = memoryview(bytearray(value_bytes))
        if parts.password:
            user = [unquote(parts.username)] if parts.username else []
            self.call(b"AUTH", *(a.encode() for a in [*user, unquote(parts.password)]))
        db = parts.path.strip("/")
        if db and db != "0":
            self.call(b"SELECT", db.encode())

    def call(self, *args: bytes) -> None:
        self.sock.sendall(self.command(*args))
        line = self.line()
        assert line.startswith(b"+"), line

    @staticmethod
    def command(*args: bytes) -> bytes:
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)

    def fill(self) -> None:
        if self.lo:
            self.buf[: self.hi - self.lo] = self.buf[self.lo : self.hi]
            self.hi, self.lo = self.hi - self.lo, 0
        self.hi += self.sock.recv_into(memoryview(self.buf)[self.hi : self.hi + 4096])

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n", self.lo, self.hi)
            if end >= 0:
                out = bytes(self.buf[self.lo : end])
                self.lo = end + 2
                return out
            self.fill()

    def bulk(self) -> int:
        """Receive one bulk reply into ``self.value``; its length."""
        size = int(self.line()[1:])
        view = self.value[:size]
        have = min(len(view), self.hi - self.lo)
        view[:have] = self.buf[self.lo : self.lo + have]
        self.lo += have
        while have < len(view):
            have += self.sock.recv_into(view[have:])
        while self.hi - self.lo < 2:
            self.fill()
        self.lo += 2  # the CRLF
        return size

    def close(self) -> None:
        self.sock.close()


def ceiling_socket(url: str, values: list[bytes], connections: int) -> tuple[float, float]:
    """Seconds for SETs then GETs of ``values`` on bare sockets (16 per pipeline)."""
    names = [f"raw:{i}".encode() for i in range(len(values))]
    conns = [RawConnection(url, max(len(v) for v in values)) for _ in range(connections)]
    parts = split(len(values), connections)
    got = [0] * len(parts)

    def put(p: int, part: range) -> None:
        conn = conns[p]
        for start in range(part.start, part.stop, 16):
            batch = range(start, min(start + 16, part.stop))
            tail = b""  # a value's CRLF goes out with the next command: 2 sends a value
            for i in batch:
                conn.sock.sendall(
                    tail
                    + b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n"
                    % (len(names[i]), names[i], len(values[i]))
                )
                conn.sock.sendall(values[i])
                tail = b"\r\n"
            conn.sock.sendall(tail)
            for _ in batch:
                assert conn.line() == b"+OK"

    def get(p: int, part: range) -> None:
        conn = conns[p]
        for start in range(part.start, part.stop, 16):
            batch = range(start, min(start + 16, part.stop))
            conn.sock.sendall(b"".join(conn.command(b"GET", names[i]) for i in batch))
            for _ in batch:
                got[p] += conn.bulk()

    try:
        put_s, get_s = threaded(parts, put), threaded(parts, get)
    finally:
        for conn in conns:
            conn.close()
    assert sum(got) == sum(len(v) for v in values)
    return put_s, get_s


def ours(tier: RedisTier, keys: list[bytes], job: int) -> tuple[float, float, float, float]:
    """Wall seconds of the puts and of the gets, then the process CPU seconds of each (every
    thread: the tier's workers included)."""
    n = len(keys)
    cpu = time.process_time()
    started = time.perf_counter()
    for start in range(0, n, job):
        part = list(range(start, min(n, start + job)))
        tier.submit_put([keys[i] for i in part], [i % tier.memory.num_slots for i in part])
    assert tier.drain(600)
    results = tier.poll()
    put = time.perf_counter() - started
    put_cpu = time.process_time() - cpu
    assert all(r.all_ok for r in results), "a put failed"
    cpu = time.process_time()
    started = time.perf_counter()
    for start in range(0, n, job):
        part = list(range(start, min(n, start + job)))
        tier.submit_get([keys[i] for i in part], [i % tier.memory.num_slots for i in part])
    assert tier.drain(600)
    results = tier.poll()
    get = time.perf_counter() - started
    get_cpu = time.process_time() - cpu
    assert all(r.all_ok for r in results), "a get failed"
    return put, get, put_cpu, get_cpu


def redis_benchmark(port: int, nbytes: int, requests: int) -> dict[str, float]:
    """The server's own figure: requests/s of redis-benchmark SET and GET, as GB/s."""
    if shutil.which("redis-benchmark") is None:
        return {}
    out = subprocess.run(
        [
            "redis-benchmark",
            "-p",
            str(port),
            "-t",
            "set,get",
            "-d",
            str(nbytes),
            "-P",
            "16",
            "-n",
            str(requests),
            "-c",
            "1",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    figures = {}
    for name, rate in re.findall(r"(SET|GET): ([0-9.]+) requests per second", out):
        figures[name.lower()] = float(rate) * nbytes / 1e9
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="server to use (default: start a throwaway one)")
    parser.add_argument("--layers", type=int, default=1, help="layers per record (default 1)")
    parser.add_argument("--mib", type=int, default=256, help="MiB moved per case (default 256)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--job", type=int, default=16, help="blocks per tier job (default 16)")
    parser.add_argument("--workers", type=int, default=1, help="tier worker threads (default 1)")
    parser.add_argument("--secret", action="store_true", help="sign records (keyed BLAKE2b)")
    parser.add_argument("--checksum", default="xxh3", choices=["xxh3", "blake2b"])
    parser.add_argument(
        "--tokens",
        type=lambda text: [int(t) for t in text.split(",")],
        default=[16, 512],
        help="tokens per block, comma-separated (default 16,512; 1 token is 4 KiB a layer)",
    )
    parser.add_argument("--quick", action="store_true", help="64 MiB, 3 rounds")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.rounds = 64, 3
    proc = workdir = None
    url = args.url
    if url is None:
        proc, url, workdir = start_server()
    client = redis.Redis.from_url(url)
    rows = []
    try:
        for tokens in args.tokens:
            nbytes = tokens * KV_BYTES_PER_TOKEN_LAYER * args.layers
            count = max(16, (args.mib << 20) // nbytes)
            memory = BytearraySlotMemory(nbytes, min(count, 64))
            for s in range(memory.num_slots):
                memory.slot_view(s)[:] = os.urandom(64) * (nbytes // 64)
            values = [bytes(memory.slot_view(i % memory.num_slots)) for i in range(count)]
            tier = RedisTier(
                memory,
                url,
                namespace=f"bench{tokens}",
                ttl_ms=600_000,
                workers=args.workers,
                checksum=args.checksum,
                secret=b"benchmark-secret-0123" if args.secret else None,
            )
            ratios: dict[str, list[float]] = {"put": [], "get": []}
            cpu_us: dict[str, list[float]] = {"put": [], "get": []}
            wall_us: dict[str, list[float]] = {"put": [], "get": []}
            gbps: dict[str, list[float]] = {
                f"{loop}{op}": []
                for loop in ("", "raw ", "redis-py ", "socket ")
                for op in ("put", "get")
            }
            for r in range(args.rounds):
                keys = [os.urandom(16) + r.to_bytes(4, "big") for _ in range(count)]
                client.flushdb()
                py_put, py_get = ceiling_redis_py(url, values, args.workers)
                client.flushdb()
                sock_put, sock_get = ceiling_socket(url, values, args.workers)
                client.flushdb()
                our_put, our_get, put_cpu, get_cpu = ours(tier, keys, args.job)
                cpu_us["put"].append(put_cpu / count * 1e6)
                cpu_us["get"].append(get_cpu / count * 1e6)
                wall_us["put"].append(our_put / count * 1e6)
                wall_us["get"].append(our_get / count * 1e6)
                total = count * nbytes
                for name, py, sock, our in (
                    ("put", py_put, sock_put, our_put),
                    ("get", py_get, sock_get, our_get),
                ):
                    raw = min(py, sock)  # the best raw loop of this round is the ceiling
                    ratios[name].append(raw / our)
                    gbps[name].append(total / our / 1e9)
                    gbps[f"raw {name}"].append(total / raw / 1e9)
                    gbps[f"redis-py {name}"].append(total / py / 1e9)
                    gbps[f"socket {name}"].append(total / sock / 1e9)
            tier.close()
            client.flushdb()
            own = (
                redis_benchmark(
                    int(url.rsplit(":", 1)[1].split("/")[0]), nbytes, max(64, count // 4)
                )
                if proc is not None
                else {}
            )
            for name in ("put", "get"):
                q = statistics.quantiles(ratios[name], n=4) if len(ratios[name]) > 1 else [0, 0, 0]
                rows.append(
                    {
                        "tokens": tokens,
                        "record_bytes": nbytes,
                        "blocks": count,
                        "op": name,
                        "ours_gbps": statistics.median(gbps[name]),
                        "ceiling_gbps": statistics.median(gbps[f"raw {name}"]),
                        "redis_py_gbps": statistics.median(gbps[f"redis-py {name}"]),
                        "socket_gbps": statistics.median(gbps[f"socket {name}"]),
                        "ratio": statistics.median(ratios[name]),
                        "ratio_iqr": [q[0], q[2]],
                        "redis_benchmark_gbps": own.get("set" if name == "put" else "get"),
                        "ours_wall_us_per_record": statistics.median(wall_us[name]),
                        "ours_cpu_us_per_record": statistics.median(cpu_us[name]),
                    }
                )
    finally:
        client.close()
        if proc is not None:
            proc.kill()
            proc.wait()
            shutil.rmtree(workdir or "", ignore_errors=True)
    meta = {
        "load_average": os.getloadavg(),
        "workers": args.workers,
        "job": args.job,
        "checksum": "keyed blake2b" if args.secret else args.checksum,
        "layers": args.layers,
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(f"# {meta}")
    print(
        f"{'tokens':>6} {'record':>9} {'op':>4} {'ours GB/s':>10} {'raw GB/s':>9} "
        f"{'ratio':>6} {'IQR':>13} {'redis-py':>9} {'socket':>7} {'redis-benchmark':>16} "
        f"{'us/rec':>7} {'cpu us/rec':>10}"
    )
    for row in rows:
        rb = row["redis_benchmark_gbps"]
        print(
            f"{row['tokens']:>6} {row['record_bytes'] >> 10:>7}Ki {row['op']:>4} "
            f"{row['ours_gbps']:>10.2f} {row['ceiling_gbps']:>9.2f} {row['ratio']:>6.2f} "
            f"{row['ratio_iqr'][0]:>6.2f}-{row['ratio_iqr'][1]:<6.2f} "
            f"{row['redis_py_gbps']:>9.2f} {row['socket_gbps']:>7.2f} "
            f"{'' if rb is None else f'{rb:.2f}':>16} "
            f"{row['ours_wall_us_per_record']:>7.1f} {row['ours_cpu_us_per_record']:>10.1f}"
        )
    print(
        "# raw GB/s: the faster raw loop of each round (redis-py pipeline or bare socket), "
        "on as many connections as the tier has workers; ratio: raw seconds / ours"
    )


if __name__ == "__main__":
    main()
