"""``RedisTier``: a shared, remote KV tier on a Redis (or Valkey) server or cluster.

What one instance stores is a hit for every other instance using the same server, prefix and
namespace. Design (``reference/tiering.md`` §2.4, §7.4):

* One key per block, ``{prefix}:{namespace}:{block key hex}``, whose value is a
  self-describing record (:mod:`kvoffload.tiers.redis.records`): written and read atomically.
* Puts are pipelined ``SET name record NX PX ttl``: no overwrite and no extra round trip. A
  name already taken is read back (bounded, as a get): a success when it holds a record this
  tier would serve (the same block from another writer: a key names its content), otherwise
  a failed put (``name_taken``: a value of another type, another secret's record, junk).
* Gets are pipelined ``PEXPIRE name ttl`` + ``GETRANGE name 0 <record bytes>``: a hit refreshes
  the TTL, so the server's own LRU/LFU eviction (``maxmemory-policy``) follows real use, and no
  value is received past one byte over the record's size (a larger one is refused,
  ``oversized``, unread). The payload is verified, then copied straight into the host slot. A
  record that fails its check is dropped and counted, and deleted only when no reader could
  accept it (damaged, or naming another namespace or key); a record signed with another
  secret, or of another version or size, is someone else's and stays. A missing key (evicted
  or expired between lookup and get) is a miss, never a loop.
* Records travel on the pool's sockets without redis-py's command packer
  (:mod:`kvoffload.tiers.redis.wire`): a put sends the record's header, then the payload
  straight from its slot (no copy), and hashes the next record while the kernel moves this one;
  a get receives each reply into one reusable buffer and verifies and copies it while the next
  is arriving. Connections, AUTH, TLS, deadlines and retries stay redis-py's; a cluster, or a
  client this cannot use (RESP3, client-side caching, one fixed connection), uses pipelines.
* Lookups: ``contains`` answers from a bounded verdict cache; unknown keys get one pipelined
  ``EXISTS`` in the background and read ``UNKNOWN`` until it lands or the lookup deadline
  passes, after which they are a ``MISS``. (``lookup="sync"`` waits up to the deadline.)
* Bounded in-flight bytes (puts over the bound fail as ``backpressure``, counted), pipelines
  cut at ``max_pipeline_bytes``, a connection pool, a per-operation socket deadline, and a
  back-off after a connection failure during which the tier answers at once (misses and failed
  jobs) instead of waiting on a dead server; the next job after the back-off reconnects.

The byte budget of a shared store is the server's (``maxmemory`` with an ``allkeys-lru`` /
``allkeys-lfu`` or ``volatile-*`` policy): no client can see everyone's records, so the tier
does not pretend to keep a budget of its own. Requires Redis 6.2+ or Valkey 7.2+.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import functools
import inspect
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvoffload._checks import check_int, redact_url
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import (
    JobKind,
    Medium,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierResult,
    check_seconds,
)
from kvoffload.tiers.redis.records import RecordCodec, RecordError

logger = logging.getLogger(__name__)

try:
    import redis as _redis
    from redis.exceptions import AuthenticationError, RedisError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from kvoffload.tiers.redis import wire
except ImportError:  # pragma: no cover - only without the [redis] extra
    _redis = None  # type: ignore[assignment]

try:
    from redis.connection import AbstractConnection as _AbstractConnection
except ImportError:  # pragma: no cover - redis-py < 5: records go through pipelines
    _AbstractConnection = None  # type: ignore[assignment,misc]

_DEFAULT_MAX_VALUE = 512 * 2**20  # redis.conf proto-max-bulk-len default
_NOT_AS_IS = frozenset(b":{}")  # bytes a namespace written as is never holds
_GLOB_SPECIAL = re.compile(rb"[][*?\\{}]")
_KEY_CHARS_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def namespace_text(namespace: bytes) -> str:
    """How ``namespace`` appears in record names: as is when it is ASCII without a colon or
    a brace, otherwise ``hex:`` and its hex digits.

    Why the marker: the colon it holds never occurs in an as-is form, so no two namespaces
    share names (``b"\\xa0\\xa1"`` and the text ``"a0a1"`` once did, and each side deleted
    the other's records). Braces are left to the hash tag (``{ns}``), so ``"{x}"`` untagged
    and ``"x"`` tagged differ too. Other as-is names are unchanged: their records stay readable.
    """
    if namespace.isascii() and not _NOT_AS_IS.intersection(namespace):
        return namespace.decode()
    return "hex:" + namespace.hex()


def glob_escape(text: bytes) -> bytes:
    """``text`` matching only itself in a ``SCAN MATCH`` pattern (Redis glob: ``* ? [ ] \\``
    are special; braces escaped too, which a hash tag puts in a name)."""
    return _GLOB_SPECIAL.sub(rb"\\\g<0>", text)


class RedisTier(Tier):
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
        if _redis is None:
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
        self.max_value_bytes = max_value_bytes
        self._is_cluster = cluster
        record_bytes = self.codec.header_bytes(bytes(40)) + memory.slot_bytes
        if record_bytes > max_value_bytes:
            raise ValueError(
                f"a record of one {memory.slot_bytes}-byte slot needs {record_bytes} bytes, over "
                f"max_value_bytes={max_value_bytes} (raise the server's proto-max-bulk-len)"
            )
        self._caps = TierCapabilities(
            medium=Medium.REMOTE,
            shared=True,
            persistent=True,
            max_batch=0,
            max_value_bytes=max_value_bytes,
            supports_delete=True,
            supports_ttl=ttl_ms > 0,
        )
        self._client = (
            client
            if client is not None
            else self._connect(
                url,
                cluster,
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

        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="kvoffload-redis")
        self._lookup_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="kvoffload-redis-lookup")
        self._futures: dict[cf.Future[None], tuple[int, JobKind, list[OffloadKey], int]] = {}
        self._done: collections.deque[TierResult] = collections.deque()
        self._next_job = 0
        self._inflight_bytes = 0
        self._verdicts: collections.OrderedDict[bytes, tuple[Presence, float]] = (
            collections.OrderedDict()
        )
        self._lookups: dict[bytes, float] = {}  # key -> deadline of its EXISTS in flight
        self._down_until: dict[str | None, float] = {}  # server (None) or cluster node
        self._backoff: dict[str | None, float] = {}
        self._last_error = ""
        self._closed = False
        self._stats: collections.Counter[str] = collections.Counter()

    # -- connection -------------------------------------------------------------------------

    @staticmethod
    def _connect(
        url: str,
        cluster: bool,
        username: str | None,
        password: str | None,
        ssl_ca_certs: str | None,
        ssl_certfile: str | None,
        ssl_keyfile: str | None,
        op_timeout_s: float,
        workers: int,
    ) -> Any:
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(f"url must look like redis://host:port/db, got {url!r}")
        kwargs: dict[str, Any] = {
            "socket_timeout": op_timeout_s,
            "socket_connect_timeout": op_timeout_s,
        }
        if username is not None:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password
        tls = {
            "ssl_ca_certs": ssl_ca_certs,
            "ssl_certfile": ssl_certfile,
            "ssl_keyfile": ssl_keyfile,
        }
        if any(tls.values()):  # TLS files imply TLS: rediss:// selects redis-py's SSL connection
            if url.startswith("redis://"):
                url = "rediss://" + url[len("redis://") :]
            kwargs.update({k: v for k, v in tls.items() if v})
        if cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(url, **kwargs)
        kwargs["max_connections"] = workers + 2
        return _redis.Redis.from_url(url, **kwargs)

    def _check_server(self) -> None:
        """Fail at start with a clear error: wrong password, unreachable, too old."""
        try:
            self._client.ping()
            probe = self._key_prefix + b"permission-probe"  # never a record's name
            self._client.getrange(probe, 0, 0)  # the ACL user may run what a get sends
            if self.ttl_ms:
                self._client.pexpire(probe, self.ttl_ms)
            if hasattr(self._client, "info") and not self._is_cluster:
                version = str(self._client.info("server").get("redis_version", "0"))
                major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
                if major_minor and major_minor < (6, 2):
                    raise ValueError(
                        f"the redis tier needs Redis 6.2+ (GETEX); {self._describe} runs {version}"
                    )
        except AuthenticationError as exc:
            raise PermissionError(
                f"redis tier: authentication failed at {self._redacted()}: {exc} "
                "(check username/password or the URL's user:password)"
            ) from exc
        except RedisError as exc:
            text = str(exc)
            refused = type(exc).__name__ == "NoPermissionError"  # redis-py strips "NOPERM"
            if refused or "NOAUTH" in text or "WRONGPASS" in text or "NOPERM" in text:
                raise PermissionError(
                    f"redis tier: the server at {self._redacted()} refused us: {text} "
                    "(give an ACL username and password allowed +set +getrange +pexpire "
                    "+exists +del +scan +strlen +ping +info)"
                ) from exc
            raise ConnectionError(f"redis tier: cannot reach {self._redacted()}: {text}") from exc

    def _direct_pool(self) -> tuple[Any, tuple[str, ...]]:
        """The client's pool, when records can go over its sockets directly (see :mod:`wire`),
        and the arguments its ``get_connection`` wants; ``(None, ())`` otherwise."""
        client = self._client
        if self._is_cluster or _AbstractConnection is None or not isinstance(client, _redis.Redis):
            return None, ()
        if getattr(client, "connection", None) is not None:  # single_connection_client
            return None, ()
        pool: Any = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if (
            not isinstance(cls, type)
            or not issubclass(cls, _AbstractConnection)
            or not isinstance(kwargs, dict)
            or kwargs.get("protocol") not in (None, 2, "2")
            or kwargs.get("cache") is not None
            or kwargs.get("cache_config") is not None
            or getattr(pool, "cache", None) is not None
        ):
            return None, ()
        try:  # redis-py < 5.3 wants a command name; later ones warn when given one
            param = inspect.signature(pool.get_connection).parameters.get("command_name")
        except (TypeError, ValueError):  # pragma: no cover
            param = None
        args = ("SET",) if param is not None and param.default is inspect.Parameter.empty else ()
        try:  # the connections must expose the socket they connected (redis-py's ``_sock``)
            conn = pool.get_connection(*args)
        except RedisError:  # pragma: no cover - the server answered _check_server just now
            return None, ()
        try:
            usable = isinstance(getattr(conn, "_sock", None), socket.socket)
        finally:
            pool.release(conn)
        return (pool, args) if usable else (None, ())

    def _redacted(self) -> str:
        return redact_url(self._describe)

    def __repr__(self) -> str:
        return (
            f"RedisTier({self._redacted()!r}, prefix={self._key_prefix.decode(errors='replace')!r}"
            f", signed={self.codec.secret is not None})"
        )

    def _name(self, key: bytes) -> bytes:
        return self._key_prefix + key.hex().encode()

    def _available(self, node: str | None = None) -> bool:
        """False while the server (or, on a cluster, ``node``) is in its back-off."""
        return time.monotonic() >= self._down_until.get(node, 0.0)

    def _note_failure(self, exc: BaseException, node: str | None = None) -> None:
        with self._lock:
            self._stats["connection_errors"] += 1
            self._last_error = f"{node or 'server'}: {type(exc).__name__}: {exc}"
            backoff = self._backoff.get(node, self.backoff_s)
            self._down_until[node] = time.monotonic() + backoff
            self._backoff[node] = min(backoff * 2, self.max_backoff_s)
        logger.warning(
            "redis tier %s: %s unavailable (%s); backing off for %.2f s",
            self._redacted(),
            node or "server",
            exc,
            backoff,
        )

    def _note_success(self, node: str | None = None) -> None:
        if node in self._down_until:
            with self._lock:
                self._down_until.pop(node, None)
                self._backoff.pop(node, None)
                if not self._down_until:
                    self._last_error = ""

    # -- contract ---------------------------------------------------------------------------

    @property
    def capabilities(self) -> TierCapabilities:
        return self._caps

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        self._check_open()
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
                if not self._is_cluster and now < self._down_until.get(None, 0.0):
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

    def _pipelined(
        self, names: Sequence[bytes], add: Callable[[Any, bytes], object], per_name: int = 1
    ) -> list[Any]:
        """One answer per name (an exception object for a failed command), never raising.

        ``add`` queues ``per_name`` commands for a name; its answer is the last one's, or the
        first failure among them. On a cluster the commands are grouped by node and each node
        gets its own pipeline, so a node that is down fails only its own keys (redis-py fails a
        whole cluster pipeline).
        """
        if not self._is_cluster:
            return self._pipeline_group(None, names, add, per_name)
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            node = self._client.get_node_from_key(name)
            groups.setdefault(node.name, []).append(i)
        answers: list[Any] = [None] * len(names)
        for node_name, indices in groups.items():
            part = self._pipeline_group(node_name, [names[i] for i in indices], add, per_name)
            for i, answer in zip(indices, part, strict=True):
                answers[i] = answer
        return answers

    def _pipeline_group(
        self,
        node: str | None,
        names: Sequence[bytes],
        add: Callable[[Any, bytes], object],
        per_name: int = 1,
    ) -> list[Any]:
        if not self._available(node):
            return [_Unavailable(f"{node or self._redacted()} is backing off")] * len(names)
        try:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                add(pipe, name)
            answers: list[Any] = pipe.execute(raise_on_error=False)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._note_failure(exc, node)
            return [exc] * len(names)
        except RedisError as exc:
            return [exc] * len(names)
        if any(isinstance(a, (RedisConnectionError, RedisTimeoutError)) for a in answers):
            self._note_failure(next(a for a in answers if isinstance(a, BaseException)), node)
        else:
            self._note_success(node)
        if per_name == 1:
            return answers
        groups = [answers[i : i + per_name] for i in range(0, len(answers), per_name)]
        return [
            next((a for a in group if isinstance(a, BaseException)), group[-1]) for group in groups
        ]

    def _direct_exchange(self, count: int, talk: Callable[[Any], list[Any]]) -> list[Any]:
        """``talk(connection)`` on one connection of the pool: ``count`` answers, never raising.

        redis-py's retry policy and the failure accounting of :meth:`_pipeline_group` apply; a
        connection that failed or was left in an unknown state is dropped, not reused.
        """
        if not self._available():
            return [_Unavailable(f"{self._redacted()} is backing off")] * count
        pool: Any = self._direct
        conn: Any = None
        try:
            conn = pool.get_connection(*self._direct_args)
            retry = getattr(conn, "retry", None)
            if retry is None:
                answers = talk(conn)
            else:
                answers = retry.call_with_retry(
                    functools.partial(talk, conn), lambda _error: conn.disconnect()
                )
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            if conn is not None:
                conn.disconnect()
            self._note_failure(exc)
            return [exc] * count
        except RedisError as exc:
            if conn is not None:
                conn.disconnect()
            return [exc] * count
        except BaseException:
            if conn is not None:
                conn.disconnect()
            raise
        finally:
            if conn is not None:
                pool.release(conn)
        if any(isinstance(a, (RedisConnectionError, RedisTimeoutError)) for a in answers):
            self._note_failure(next(a for a in answers if isinstance(a, BaseException)))
        else:
            self._note_success()
        return answers

    def _remember(
        self, key: bytes, presence: Presence, now: float, ttl: float | None = None
    ) -> None:
        """Cache a verdict (lock held), for ``ttl`` seconds (default: by its kind)."""
        if ttl is None:
            ttl = self.verdict_ttl_s if presence is Presence.HIT else self.negative_ttl_s
        self._verdicts[key] = (presence, now + ttl)
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > self.verdict_cache_entries:
            self._verdicts.popitem(last=False)

    def _new_job(self) -> int:
        self._check_open()
        with self._lock:
            self._next_job += 1
            return self._next_job

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the redis tier is closed")

    @staticmethod
    def _check_batch(keys: Sequence[OffloadKey], slots: Sequence[int]) -> None:
        if isinstance(keys, (bytes, str)) or isinstance(slots, (bytes, str)):
            raise TypeError("keys and slots must be sequences (a single key is [key])")
        if len(keys) != len(slots):
            raise ValueError(f"{len(keys)} keys but {len(slots)} slots")

    def _launch(
        self,
        job: Callable[[], TierResult],
        meta: tuple[int, JobKind, list[OffloadKey], int],
        reserved: int = 0,
    ) -> None:
        def run() -> None:
            try:
                result = job()
            finally:
                if reserved:
                    with self._lock:
                        self._inflight_bytes -= reserved
            self._done.append(result)

        future = self._pool.submit(run)
        with self._lock:
            self._futures[future] = meta
        future.add_done_callback(self._forget)

    def _forget(self, future: cf.Future[None]) -> None:
        with self._lock:
            meta = self._futures.pop(future, None)
        if future.cancelled():  # closed before it ran: still reported, once, as failed
            if meta is not None:
                job_id, kind, keys, generation = meta
                self._done.append(self._failed(job_id, kind, keys, generation, "cancelled"))
            return
        exc = future.exception()
        if exc is not None:  # a bug in a job: never lose the job, but show the bug
            logger.error("redis tier job raised", exc_info=exc)

    def _failed(
        self, job_id: int, kind: JobKind, keys: Sequence[OffloadKey], generation: int, reason: str
    ) -> TierResult:
        self._stats[f"failed_{reason}"] += len(keys)
        return TierResult(
            job_id=job_id,
            kind=kind,
            keys=tuple(keys),
            ok=(False,) * len(keys),
            generation=generation,
            reasons=dict.fromkeys(range(len(keys)), reason),
        )

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._check_batch(keys, slots)
        job_id = self._new_job()
        keys, slots = list(keys), list(slots)
        nbytes = len(keys) * self.memory.slot_bytes
        with self._lock:
            self._stats["put_jobs"] += 1
            over = self._inflight_bytes + nbytes > self.max_inflight_bytes and self._inflight_bytes
            unavailable = not self._is_cluster and not self._available()
            if not over and not unavailable:
                self._inflight_bytes += nbytes
        if unavailable:
            self._done.append(self._failed(job_id, JobKind.PUT, keys, generation, "unavailable"))
        elif over:
            self._done.append(self._failed(job_id, JobKind.PUT, keys, generation, "backpressure"))
        else:
            self._launch(
                lambda: self._run_put(job_id, keys, slots, generation),
                (job_id, JobKind.PUT, keys, generation),
                nbytes,
            )
        return job_id

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        self._check_batch(keys, slots)
        for slot in slots:
            if not 0 <= slot < self.memory.num_slots:
                raise ValueError(f"slot {slot} out of range [0, {self.memory.num_slots})")
        job_id = self._new_job()
        keys, slots = list(keys), list(slots)
        with self._lock:
            self._stats["get_jobs"] += 1
        if not self._is_cluster and not self._available():
            self._done.append(self._failed(job_id, JobKind.GET, keys, generation, "unavailable"))
        else:
            self._launch(
                lambda: self._run_get(job_id, keys, slots, generation),
                (job_id, JobKind.GET, keys, generation),
            )
        return job_id

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        if isinstance(keys, (bytes, str)):
            raise TypeError("keys must be a sequence (a single key is [key])")
        job_id = self._new_job()
        keys = list(keys)
        if not self._available():
            self._done.append(self._failed(job_id, JobKind.DELETE, keys, generation, "unavailable"))
        else:
            self._launch(
                lambda: self._run_delete(job_id, keys, generation),
                (job_id, JobKind.DELETE, keys, generation),
            )
        return job_id

    def _pieces(self, count: int, per_item: int) -> Iterator[range]:
        step = max(1, self.max_pipeline_bytes // max(per_item, 1))
        for start in range(0, count, step):
            yield range(start, min(count, start + step))

    def _run_put(
        self, job_id: int, keys: list[OffloadKey], slots: list[int], generation: int
    ) -> TierResult:
        started = time.perf_counter()
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        written = 0
        px = self.ttl_ms or None
        for piece in self._pieces(len(keys), self.memory.slot_bytes):
            names = [self._name(keys[i]) for i in piece]
            if self._direct is not None:
                answers = self._direct_exchange(
                    len(piece),
                    functools.partial(
                        self._send_records,
                        names=names,
                        keys=[keys[i] for i in piece],
                        slots=[slots[i] for i in piece],
                        px=px,
                    ),
                )
            else:
                buffers = self._record_buffers(len(piece))
                records = {
                    name: self.codec.encode_into(buf, keys[i], self.memory.slot_view(slots[i]))
                    for name, i, buf in zip(names, piece, buffers, strict=False)
                }
                answers = self._pipelined(
                    names, functools.partial(_set_absent, records=records, px=px)
                )
            taken = [
                i
                for i, answer in zip(piece, answers, strict=True)
                if not answer and not isinstance(answer, BaseException)
            ]
            unreadable = self._check_taken([keys[i] for i in taken])
            now = time.monotonic()
            with self._lock:
                for i, answer in zip(piece, answers, strict=True):
                    if isinstance(answer, BaseException):
                        reasons[i] = _reason_of(answer)
                        continue
                    if answer:
                        ok[i] = True
                        written += self.memory.slot_bytes
                        self._stats["records_written"] += 1
                        self._remember(keys[i], Presence.HIT, now)
                    elif keys[i] in unreadable:  # NX found a name we cannot read back
                        reasons[i] = unreadable[keys[i]]
                        ttl = self.verdict_ttl_s if reasons[i] == "name_taken" else None
                        self._remember(keys[i], Presence.MISS, now, ttl)  # EXISTS says HIT
                    else:  # NX: another writer (or an earlier put) stored it already
                        ok[i] = True
                        self._stats["records_existing"] += 1
                        self._remember(keys[i], Presence.HIT, now)
        return self._result(job_id, JobKind.PUT, keys, ok, generation, written, started, reasons)

    def _check_taken(self, keys: list[OffloadKey]) -> dict[OffloadKey, str]:
        """Of ``keys`` whose ``SET NX`` found the name taken, those we could not read back,
        each with its reason: ``name_taken`` (another value type, another secret's or
        namespace's record, junk, another slot size, gone since) or why the check failed.

        Why read it: ``NX`` says only that the name exists. A put is a success when what sits
        there is a record this tier would serve (the same block, from another writer); the
        check costs one bounded read, and only for puts that found their name taken.
        """
        if not keys:
            return {}
        limits = {self._name(key): self._record_bytes(key) for key in keys}
        answers = self._pipelined(
            list(limits), lambda pipe, name: pipe.getrange(name, 0, limits[name])
        )
        out: dict[OffloadKey, str] = {}
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, BaseException):
                if "WRONGTYPE" not in str(answer):
                    out[key] = _reason_of(answer)
                    continue
                error: Exception = RecordError("name_taken", "a value of another type")
            else:
                try:
                    if not answer:
                        raise RecordError("name_taken", "gone since the put found it")
                    if len(answer) > self._record_bytes(key):
                        raise RecordError("name_taken", "a value longer than our record")
                    payload = self.codec.payload_of(key, memoryview(answer))
                    if len(payload) != self.memory.slot_bytes:
                        raise RecordError("name_taken", f"a {len(payload)}-byte payload")
                    continue
                except RecordError as exc:
                    error = exc
            out[key] = "name_taken"
            logger.warning("redis tier: put of %s found its name taken (%s)", key.hex(), error)
        return out

    def _send_records(
        self,
        conn: Any,
        *,
        names: list[bytes],
        keys: list[OffloadKey],
        slots: list[int],
        px: int | None,
    ) -> list[Any]:
        """``SET name record NX [PX px]`` for each record on ``conn``; one answer per record.

        Each record's header is built (and its payload hashed) just before it is sent, so the
        next one is hashed while the kernel and the server move this one; the payload is sent
        from its slot, never copied (the slot stays unchanged until the job is polled).
        """
        tail = b""
        for n, (name, key, slot) in enumerate(zip(names, keys, slots, strict=True)):
            payload = self.memory.slot_view(slot)
            header = self.codec.header(key, payload)
            head = tail + wire.set_head(name, len(header) + len(payload), px is not None)
            conn.send_packed_command([head + header, payload], check_health=n == 0)
            tail = wire.set_tail(px)
        conn.send_packed_command([tail], check_health=False)
        replies = wire.Replies(conn._sock)
        answers = [replies.reply() for _ in names]
        if replies.buffered:
            raise RedisConnectionError("Protocol error: data after the last reply")
        return answers

    def _fetch_records(
        self,
        conn: Any,
        *,
        names: list[bytes],
        keys: list[OffloadKey],
        slots: list[int],
        px: int,
    ) -> list[Any]:
        """``PEXPIRE name PX px`` (none without a TTL) and ``GETRANGE name 0 <record bytes>``
        for each name on ``conn``: one outcome per record (see :meth:`_outcome`), each verified
        and copied as soon as it has arrived. No reply is received beyond one byte over the
        record's size: a longer bulk length is a protocol error, before its bytes are read."""
        limits = [self._record_bytes(key) for key in keys]
        conn.send_packed_command(
            [
                b"".join(
                    wire.get_command(name, px, limit)
                    for name, limit in zip(names, limits, strict=True)
                )
            ]
        )
        replies = wire.Replies(conn._sock)
        buffer = self._get_buffer()
        allowed = 0

        def buffer_for(size: int) -> memoryview:
            if size > allowed:
                raise RedisConnectionError(
                    f"Protocol error: {size} bytes for a GETRANGE of at most {allowed}"
                )
            return buffer[:size] if size <= len(buffer) else memoryview(bytearray(size))

        outcomes: list[Any] = []
        for key, slot, limit in zip(keys, slots, limits, strict=True):
            refreshed = replies.reply() if px else None
            allowed = limit + 1
            answer = replies.reply(buffer_for)
            if isinstance(refreshed, Exception):  # the command failed (its range is moot)
                answer = refreshed
            elif not (answer is None or isinstance(answer, (memoryview, Exception))):
                raise RedisConnectionError(f"Protocol error: {type(answer).__name__} for GETRANGE")
            outcomes.append(self._outcome(key, slot, answer))
        if replies.buffered:
            raise RedisConnectionError("Protocol error: data after the last reply")
        return outcomes

    def _record_bytes(self, key: bytes) -> int:
        """The size of ``key``'s record: no value under its name is received past one byte
        more (see :func:`wire.get_command`)."""
        return self.codec.header_bytes(key) + self.memory.slot_bytes

    def _outcome(self, key: OffloadKey, slot: int, answer: Any) -> Any:
        """What a ``GETRANGE`` answer means: ``True`` (verified, copied into ``slot``), ``None``
        (missing: the empty string of an absent name), a :class:`RecordError`, or the
        exception object of a failed command."""
        if isinstance(answer, (bytes, bytearray, memoryview)):
            return self._load(key, slot, answer) if len(answer) else None
        if answer is None or isinstance(answer, BaseException):
            return answer
        return RecordError("corrupt", f"a {type(answer).__name__} reply to GETRANGE")

    def _get_buffer(self) -> memoryview:
        """This thread's reusable receive buffer, one record of the largest key."""
        buffer: memoryview | None = getattr(self._local, "get_buffer", None)
        if buffer is None:
            size = self.codec.header_bytes(bytes(64)) + self.memory.slot_bytes
            buffer = self._local.get_buffer = memoryview(bytearray(size))
        return buffer

    def _load(self, key: OffloadKey, slot: int, record: bytes | bytearray | memoryview) -> Any:
        """Verify ``record`` and copy its payload into ``slot``: ``True``, or the
        :class:`RecordError` that says why it must not be served (the slot is untouched)."""
        try:
            if len(record) > self._record_bytes(key):  # a range cut at one byte over
                self.codec.check_header(key, memoryview(record))
                raise RecordError(  # ours but for another slot size: some other reader's
                    "oversized", f"a value longer than the {self._record_bytes(key)}-byte record"
                )
            payload = self.codec.payload_of(key, memoryview(record))
            view = self.memory.slot_view(slot)
            if len(payload) != len(view):
                raise RecordError(
                    "foreign", f"{len(payload)} payload bytes for a {len(view)}-byte slot"
                )
            view[:] = payload
        except RecordError as exc:
            return exc
        return True

    def _record_buffers(self, count: int) -> list[bytearray]:
        """This thread's reusable record buffers (no 2 MiB allocation and free per record)."""
        buffers: list[bytearray] | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = []
        size = self.codec.header_bytes(bytes(64)) + self.memory.slot_bytes
        while len(buffers) < count:
            buffers.append(bytearray(size))
        return buffers[:count]

    def _run_get(
        self, job_id: int, keys: list[OffloadKey], slots: list[int], generation: int
    ) -> TierResult:
        started = time.perf_counter()
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        read = 0
        bad: list[bytes] = []
        px = self.ttl_ms
        limits = {self._name(key): self._record_bytes(key) for key in keys}

        def fetch(pipe: Any, name: bytes) -> object:
            if px:
                pipe.pexpire(name, px)
            return pipe.getrange(name, 0, limits[name])

        for piece in self._pieces(len(keys), self.memory.slot_bytes):
            names = [self._name(keys[i]) for i in piece]
            if self._direct is not None:
                outcomes = self._direct_exchange(
                    len(piece),
                    functools.partial(
                        self._fetch_records,
                        names=names,
                        keys=[keys[i] for i in piece],
                        slots=[slots[i] for i in piece],
                        px=px,
                    ),
                )
            else:
                answers = self._pipelined(names, fetch, 2 if px else 1)
                outcomes = [
                    self._outcome(keys[i], slots[i], answer)
                    for i, answer in zip(piece, answers, strict=True)
                ]
            now = time.monotonic()
            dropped: list[tuple[OffloadKey, RecordError]] = []
            with self._lock:  # one acquisition a piece, not one a record
                for i, outcome in zip(piece, outcomes, strict=True):
                    if outcome is True:
                        ok[i] = True
                        read += self.memory.slot_bytes
                        self._stats["hits"] += 1
                        self._remember(keys[i], Presence.HIT, now)
                    elif isinstance(outcome, RecordError):
                        reasons[i] = outcome.reason
                        dropped.append((keys[i], outcome))
                        self._stats[f"rejected_{outcome.reason}"] += 1
                        if outcome.garbage:
                            bad.append(keys[i])
                            self._remember(keys[i], Presence.MISS, now)
                        else:  # another secret's or slot size's: left alone, and trusted to
                            # stay unreadable for as long as a hit is (EXISTS would say HIT
                            # and the next get would move the same record again)
                            self._remember(keys[i], Presence.MISS, now, self.verdict_ttl_s)
                    elif outcome is None:  # expired or evicted since the lookup: a miss, no retry
                        reasons[i] = "missing"
                        self._stats["misses"] += 1
                        self._remember(keys[i], Presence.MISS, now)
                    else:  # an exception object: the command failed
                        reasons[i] = _reason_of(outcome)
            for key, error in dropped:
                logger.warning("redis tier: dropped record %s (%s)", key.hex(), error)
        if bad:
            answers = self._pipelined([self._name(k) for k in bad], lambda p, n: p.delete(n))
            with self._lock:
                self._stats["records_deleted_bad"] += sum(a == 1 for a in answers)
        return self._result(job_id, JobKind.GET, keys, ok, generation, read, started, reasons)

    def _run_delete(self, job_id: int, keys: list[OffloadKey], generation: int) -> TierResult:
        started = time.perf_counter()
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        answers = self._pipelined([self._name(k) for k in keys], lambda p, n: p.delete(n))
        now = time.monotonic()
        with self._lock:
            for i, answer in enumerate(answers):
                if isinstance(answer, BaseException):
                    reasons[i] = _reason_of(answer)
                    continue
                ok[i] = bool(answer)
                if not answer:
                    reasons[i] = "missing"
                self._remember(keys[i], Presence.MISS, now)
        return self._result(job_id, JobKind.DELETE, keys, ok, generation, 0, started, reasons)

    def _result(
        self,
        job_id: int,
        kind: JobKind,
        keys: list[OffloadKey],
        ok: list[bool],
        generation: int,
        nbytes: int,
        started: float,
        reasons: dict[int, str],
    ) -> TierResult:
        seconds = time.perf_counter() - started
        with self._lock:
            self._stats[f"{kind.value}_bytes"] += nbytes
            self._stats[f"{kind.value}_seconds"] += seconds  # type: ignore[assignment]
            for reason in reasons.values():
                self._stats[f"{kind.value}_failed_{reason}"] += 1
        return TierResult(
            job_id=job_id,
            kind=kind,
            keys=tuple(keys),
            ok=tuple(ok),
            generation=generation,
            nbytes=nbytes,
            seconds=seconds,
            reasons=reasons,
        )

    def poll(self) -> list[TierResult]:
        out: list[TierResult] = []
        while True:
            try:
                out.append(self._done.popleft())
            except IndexError:
                return out

    def drain(self, timeout: float) -> bool:
        with self._lock:
            pending = list(self._futures)
        if not pending:
            return True
        _done, not_done = cf.wait(pending, timeout=max(0.0, timeout))
        return not not_done

    def health(self) -> TierHealth:
        if self._closed:
            return TierHealth(False, "closed")
        down = [n for n, until in self._down_until.items() if until > time.monotonic()]
        if None in down:
            return TierHealth(False, f"backing off after: {self._last_error}")
        if down:
            return TierHealth(True, f"{len(down)} cluster node(s) backing off: {self._last_error}")
        return TierHealth(True)

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = {k: float(v) for k, v in self._stats.items()}
            out["inflight_bytes"] = float(self._inflight_bytes)
            out["inflight_jobs"] = float(len(self._futures))
            out["verdict_cache_entries"] = float(len(self._verdicts))
            out["available"] = 1.0 if self._available() else 0.0
            now = time.monotonic()
            out["nodes_backing_off"] = float(sum(u > now for u in self._down_until.values()))
        return out

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
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._lookup_pool.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(RedisError):  # closing a dead connection
            self._client.close()


def _set_absent(
    pipe: Any, name: bytes, *, records: dict[bytes, memoryview], px: int | None
) -> object:
    """Queue ``SET name record NX [PX px]``: never overwrite, one round trip."""
    return pipe.set(name, records[name], nx=True, px=px)


class _Unavailable(Exception):
    """The answer for a key whose server or node is in its back-off (no command was sent)."""


def _reason_of(exc: BaseException) -> str:
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, _Unavailable)):
        return "unavailable"
    text = str(exc)
    if "OOM" in text or type(exc).__name__ == "OutOfMemoryError":  # redis-py strips the "OOM"
        return "server_full"
    return "server_error"
