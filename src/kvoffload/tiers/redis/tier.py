"""``RedisTier``: a shared, remote KV tier on a Redis (or Valkey) server or cluster.

What one instance stores is a hit for every other instance using the same server, prefix and
namespace (``reference/tiering.md`` §2.4, §7.4). One key per block,
``{prefix}:{namespace}:{block key hex}``, holds a self-describing record
(:mod:`kvoffload.tiers.redis.records`); puts are ``SET NX PX``, gets ``PEXPIRE`` +
``GETRANGE`` (a hit refreshes the TTL), lookups a bounded verdict cache in front of a
background ``EXISTS``. The commands, and why each is what it is, are in ``docs/redis.md``.

The byte budget of a shared store is the server's (``maxmemory`` with an ``allkeys-lru`` /
``allkeys-lfu`` or ``volatile-*`` policy): no client can see everyone's records, so the tier
does not pretend to keep a budget of its own. Requires Redis 6.2+ or Valkey 7.2+.

Split by job: ``connect`` (client, start-up checks, the direct socket pool), ``transport``
(pipelines, direct exchanges, back-off), ``record_io`` (a job's records as commands and
verdicts), ``wire`` (records sent and received on pooled sockets without redis-py's packer);
this module keeps the contract, the verdict cache and the jobs (on ``runtime``).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvoffload._checks import check_int
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import (
    JobKind,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierResult,
    TierStats,
    check_seconds,
)
from kvoffload.tiers.redis.connect import glob_escape, namespace_text, redis_available
from kvoffload.tiers.redis.record_io import Outcome, RedisRecordIO
from kvoffload.tiers.redis.records import RecordCodec
from kvoffload.tiers.redis.transport import RedisError
from kvoffload.tiers.runtime import CANCELLED, CLOSED, Job, TierRuntime, check_batch

logger = logging.getLogger(__name__)

_DEFAULT_MAX_VALUE = 512 * 2**20  # redis.conf proto-max-bulk-len default
_KEY_CHARS_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")

#: Where a job's bytes and seconds are counted, by kind (a delete's are this tier's own).
_BYTES = {JobKind.PUT: "bytes_written", JobKind.GET: "bytes_read", JobKind.DELETE: "delete_bytes"}
_SECONDS = {
    JobKind.PUT: "write_seconds",
    JobKind.GET: "read_seconds",
    JobKind.DELETE: "delete_seconds",
}


class RedisTier(RedisRecordIO, Tier):
    """A Redis/Valkey tier. See the module docstring for the protocol.

    Args:
        memory: the host slots records are copied from and into.
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS); for a cluster,
            any node's address with ``cluster=True``.
        namespace: bytes or str naming model / dtype / layout (``namespace_fingerprint``);
            instances share blocks only within one namespace.
        prefix: key prefix (letters, digits, ``-_.``), e.g. one per deployment.
        secret: optional shared secret (16 to 64 bytes, or a str): records are signed with
            keyed BLAKE2b and unsigned or foreign-signed records are rejected.
        checksum: ``"blake2b"`` or ``"xxh3"`` for unsigned records.
        ttl_ms: record time to live, refreshed on every hit (0: no expiry).
        cluster: use Redis Cluster (``redis.cluster.RedisCluster``).
        hash_tag: ``"none"`` or ``"namespace"`` (cluster only: every record of a namespace in
            one hash slot, so a multi-key pipeline goes to one node).
        username, password: ACL credentials (override the URL's).
        ssl_ca_certs, ssl_certfile, ssl_keyfile: TLS files (implies TLS).
        op_timeout_s: socket deadline per operation.
        lookup_deadline_ms: how long a key may stay ``UNKNOWN`` before it is a miss.
        lookup: ``"async"`` (never waits) or ``"sync"`` (``contains`` waits up to the deadline).
        verdict_ttl_s / negative_ttl_s: how long a cached HIT / MISS is trusted.
        verdict_cache_entries: bound of the verdict cache.
        max_inflight_bytes: puts beyond this many bytes in flight fail as ``backpressure``.
        max_pipeline_bytes: a job's pipeline is cut into pieces of about this size.
        workers: threads running jobs (one connection each at a time).
        backoff_s / max_backoff_s: back-off after a connection failure (doubling).
        max_value_bytes: largest record accepted (the server's ``proto-max-bulk-len``).
        client: an existing ``redis.Redis`` / ``RedisCluster`` to use instead of ``url``.
    """

    name = "redis"

    def __init__(
        self,
        memory: SlotMemory,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: bytes | str = b"default",
        prefix: str = "kvoffload",
        secret: bytes | str | None = None,
        checksum: str = "blake2b",
        ttl_ms: int = 24 * 3600 * 1000,
        cluster: bool = False,
        hash_tag: str = "none",
        username: str | None = None,
        password: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        op_timeout_s: float = 2.0,
        lookup_deadline_ms: float = 50.0,
        lookup: str = "async",
        verdict_ttl_s: float = 1.0,
        negative_ttl_s: float = 0.05,
        verdict_cache_entries: int = 65536,
        max_inflight_bytes: int = 512 * 2**20,
        max_pipeline_bytes: int = 32 * 2**20,
        workers: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        max_value_bytes: int = _DEFAULT_MAX_VALUE,
        client: Any = None,
    ) -> None:
        super().__init__(memory)
        if not redis_available():
            raise ImportError("the redis tier needs redis-py: pip install 'kvoffload[redis]'")
        if isinstance(namespace, str):
            namespace = namespace.encode()
        if not isinstance(namespace, bytes):
            raise TypeError(
                f"namespace must be non-empty bytes or str, got {type(namespace).__name__}"
            )
        if not namespace:
            raise ValueError("namespace must be non-empty bytes or str, got an empty one")
        if isinstance(secret, str):
            secret = secret.encode()
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str of letters, digits or '-_.', got {prefix!r}")
        if not prefix or not set(prefix) <= _KEY_CHARS_OK:
            raise ValueError(f"prefix must be letters, digits or '-_.', got {prefix!r}")
        if lookup not in ("async", "sync"):
            raise ValueError(f"lookup must be 'async' or 'sync', got {lookup!r}")
        if hash_tag not in ("none", "namespace"):
            raise ValueError(f"hash_tag must be 'none' or 'namespace', got {hash_tag!r}")
        check_int("ttl_ms", ttl_ms, 0, why=" (0: no expiry)")
        for pname, pvalue in (
            ("op_timeout_s", op_timeout_s),
            ("lookup_deadline_ms", lookup_deadline_ms),
            ("verdict_ttl_s", verdict_ttl_s),
            ("negative_ttl_s", negative_ttl_s),
            ("backoff_s", backoff_s),
            ("max_backoff_s", max_backoff_s),
        ):
            check_seconds(pname, pvalue, positive=True)
        for pname, pvalue in (
            ("verdict_cache_entries", verdict_cache_entries),
            ("max_inflight_bytes", max_inflight_bytes),
            ("max_pipeline_bytes", max_pipeline_bytes),
            ("workers", workers),
            ("max_value_bytes", max_value_bytes),
        ):
            check_int(pname, pvalue, 1)
        self.codec = RecordCodec(namespace=namespace, secret=secret, algorithm=checksum)
        ns_text = namespace_text(namespace)
        ns_part = f"{{{ns_text}}}" if hash_tag == "namespace" else ns_text
        self._key_prefix = f"{prefix}:{ns_part}:".encode()
        self.ttl_ms = ttl_ms
        self.lookup_mode = lookup
        self.lookup_deadline_s = lookup_deadline_ms / 1000.0
        self.verdict_ttl_s = float(verdict_ttl_s)
        self.negative_ttl_s = float(negative_ttl_s)
        self.verdict_cache_entries = verdict_cache_entries
        self.max_inflight_bytes = max_inflight_bytes
        self.max_pipeline_bytes = max_pipeline_bytes
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self._is_cluster = cluster
        record_bytes = self._record_bytes(bytes(40))
        if record_bytes > max_value_bytes:
            raise ValueError(
                f"a record of one {memory.slot_bytes}-byte slot needs {record_bytes} bytes, over "
                f"max_value_bytes={max_value_bytes} (raise the server's proto-max-bulk-len)"
            )
        self._caps = TierCapabilities(max_value_bytes=max_value_bytes)
        self._client = (
            client
            if client is not None
            else self._connect(
                url,
                username,
                password,
                ssl_ca_certs,
                ssl_certfile,
                ssl_keyfile,
                op_timeout_s,
                workers,
            )
        )
        self._describe = url if client is None else type(client).__name__
        self._check_server()
        self._direct, self._direct_args = self._direct_pool()

        self._runtime = TierRuntime(workers, "kvoffload-redis")
        self._lock = self._runtime.lock
        self._local = threading.local()
        self._lookup_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="kvoffload-redis-lookup")
        self._inflight_bytes = 0
        self._verdicts: collections.OrderedDict[bytes, tuple[Presence, float]] = (
            collections.OrderedDict()
        )
        self._lookups: dict[bytes, float] = {}  # key -> deadline of its EXISTS in flight
        self._down_until: dict[str | None, float] = {}  # server (None) or cluster node
        self._backoff: dict[str | None, float] = {}
        self._last_error = ""
        self._stats: collections.Counter[str] = collections.Counter()

    def __repr__(self) -> str:
        return (
            f"RedisTier({self._redacted()!r}, prefix={self._key_prefix.decode(errors='replace')!r}"
            f", signed={self.codec.secret is not None})"
        )

    # -- contract ---------------------------------------------------------------------------

    @property
    def capabilities(self) -> TierCapabilities:
        return self._caps

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        if self._runtime.closed:  # nothing is served after close
            return [Presence.MISS] * len(keys)
        now = time.monotonic()
        out: list[Presence] = []
        to_check: list[bytes] = []
        with self._lock:
            self._stats["lookups"] += len(keys)
            for key in keys:
                cached = self._verdicts.get(key)
                if cached is not None and cached[1] > now:
                    out.append(cached[0])
                    self._stats["verdict_cache_hits"] += 1
                    continue
                deadline = self._lookups.get(key)
                if deadline is not None:
                    out.append(Presence.UNKNOWN if deadline > now else Presence.MISS)
                    continue
                if now < self._down_until.get(None, 0.0):
                    out.append(Presence.MISS)
                    continue
                self._lookups[key] = now + self.lookup_deadline_s
                to_check.append(key)
                out.append(Presence.UNKNOWN)
        if to_check:
            future = self._lookup_pool.submit(self._run_lookup, to_check)
            if self.lookup_mode == "sync":
                cf.wait([future], timeout=self.lookup_deadline_s)
                now = time.monotonic()
                with self._lock:
                    for i, key in enumerate(keys):
                        if out[i] is Presence.UNKNOWN:
                            cached = self._verdicts.get(key)
                            out[i] = cached[0] if cached and cached[1] > now else Presence.MISS
        hits = out.count(Presence.HIT)
        if hits:
            with self._lock:
                self._stats["lookup_hits"] += hits
        return out

    def _run_lookup(self, keys: list[bytes]) -> None:
        names = [self._name(k) for k in keys]
        answers = self._pipelined(names, lambda pipe, name: pipe.exists(name))
        now = time.monotonic()
        with self._lock:
            for key, answer in zip(keys, answers, strict=True):
                self._lookups.pop(key, None)
                if isinstance(answer, BaseException):
                    self._stats["lookup_errors"] += 1
                    continue  # no verdict: the key reads MISS until asked again
                self._remember(key, Presence.HIT if answer else Presence.MISS, now)

    def _submit(
        self,
        kind: JobKind,
        keys: tuple[OffloadKey, ...],
        generation: int,
        run: Callable[[], Outcome],
    ) -> int:
        """A new job, ``run`` on a worker (its outcome is the job's; a put holds its bytes of
        the in-flight bound); one that may not run is reported at once, each key failed."""
        with self._lock:  # the closed check and the hand-off in one step: close waits for it
            self._stats[f"{kind.value}_jobs"] += 1
            if kind is not JobKind.DELETE:  # "deletes" counts records deleted
                self._stats[f"{kind.value}s"] += len(keys)
            job = self._runtime.open_job(kind, keys, generation)
            if self._runtime.closed:
                return self._fail(job, CLOSED)
            if not self._available():  # on a cluster each node's back-off is checked per key
                return self._fail(job, "unavailable")
            nbytes = len(keys) * self.memory.slot_bytes if kind is JobKind.PUT else 0
            inflight = self._inflight_bytes
            if kind is JobKind.PUT and inflight and inflight + nbytes > self.max_inflight_bytes:
                return self._fail(job, "backpressure")
            self._inflight_bytes += nbytes
            self._runtime.spawn(job, self._run_job, job, run, nbytes)
            return job.job_id

    def _run_job(self, job: Job, run: Callable[[], Outcome], reserved: int) -> None:
        outcome: Outcome | None = None
        started = time.perf_counter()
        if not self._runtime.closed:
            try:
                outcome = run()
            except Exception:  # a bug in a job: never lose the job, but show the bug
                logger.exception("redis tier job %d raised", job.job_id)
        seconds = time.perf_counter() - started
        with self._lock:
            self._inflight_bytes -= reserved
            if outcome is None:
                self._fail(job, CANCELLED if self._runtime.closed else "io_error", 1)
                return
            job.ok[:], reasons, job.nbytes = outcome
            job.reasons.update(reasons)
            self._stats[_BYTES[job.kind]] += job.nbytes
            self._stats[_SECONDS[job.kind]] += seconds  # type: ignore[assignment]
            for reason in reasons.values():
                self._stats[f"{job.kind.value}_failed_{reason}"] += 1
            self._runtime.finish(job, 1)

    def _fail(self, job: Job, reason: str, tasks_done: int = 0) -> int:
        """Report ``job``, every key without a verdict failed with ``reason`` (lock held)."""
        self._stats[f"failed_{reason}"] += len(job.keys)
        job.fail_all(reason)
        return self._runtime.finish(job, tasks_done)

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys, slots = check_batch(keys, slots, self.memory.num_slots)
        return self._submit(JobKind.PUT, keys, generation, lambda: self._run_put(keys, slots))

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys, slots = check_batch(keys, slots, self.memory.num_slots)
        return self._submit(JobKind.GET, keys, generation, lambda: self._run_get(keys, slots))

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        if isinstance(keys, (bytes, str)):
            raise TypeError("keys must be a sequence (a single key is [key])")
        keys = tuple(keys)
        return self._submit(JobKind.DELETE, keys, generation, lambda: self._run_delete(keys))

    def poll(self) -> list[TierResult]:
        return self._runtime.poll()

    def drain(self, timeout: float) -> bool:
        return self._runtime.drain(timeout)

    def health(self) -> TierHealth:
        if self._runtime.closed:
            return TierHealth(False, "closed")
        down = [n for n, until in self._down_until.items() if until > time.monotonic()]
        if None in down:
            return TierHealth(False, f"backing off after: {self._last_error}")
        if down:
            return TierHealth(True, f"{len(down)} cluster node(s) backing off: {self._last_error}")
        return TierHealth(True)

    def tier_stats(self) -> TierStats:
        """The common figures (no budget, records or evictions of its own: the server keeps
        those); in ``extra`` the server's side: back-off, verdict cache, records found
        existing, rejected by reason (``rejected_<reason>``) and failed keys by reason."""
        with self._lock:
            counts = self._stats
            now = time.monotonic()
            return TierStats.from_mapping(
                {
                    **counts,
                    "inflight_bytes": self._inflight_bytes,
                    "verdict_cache_entries": len(self._verdicts),
                    "available": 1.0 if self._available() else 0.0,
                    "nodes_backing_off": sum(u > now for u in self._down_until.values()),
                    "failed_keys": sum(v for k, v in counts.items() if "failed_" in k),
                    "bad_records": sum(v for k, v in counts.items() if k.startswith("rejected_")),
                    "jobs_in_flight": self._runtime.jobs_in_flight,
                }
            )

    def scan(self) -> Iterator[ScannedBlock]:
        """Records of this prefix and namespace on the server (``SCAN``; sizes by ``STRLEN``)."""
        pattern = glob_escape(self._key_prefix) + b"*"
        names = list(self._client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(names), 1000):
            chunk = names[start : start + 1000]
            pipe = self._client.pipeline(transaction=False)
            for name in chunk:
                pipe.strlen(name)
            for name, size in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(size, BaseException) or not size:
                    continue
                try:
                    key = bytes.fromhex(name[len(self._key_prefix) :].decode())
                except ValueError:
                    continue
                yield ScannedBlock(OffloadKey(key), int(size), 0.0)

    def close(self) -> None:
        if not self._runtime.close():
            return
        self._lookup_pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(RedisError):  # closing a dead connection
            self._client.close()
