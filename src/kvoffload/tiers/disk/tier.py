"""``DiskTier``: a bounded, crash-safe, checksummed store of host slots on a local filesystem.

What it fixes in the peers (``reference/tiering.md`` §1.5, §1.11, §2.5): a byte budget and a
free-space floor (vLLM's fs tier has neither and never deletes a file), eviction by any registry
policy with in-flight records pinned, self-describing records written to a temporary name and
renamed (optionally fsynced), a warm restart that rebuilds the index from the directory (the
LMCache and SGLang restart misses) and deletes temporary or torn files, a checksum verified on
every read (a bad record is a counted miss, never data), and per-key I/O tasks on a thread pool
so one large batch uses every thread (vLLM runs one job serially on one thread).

Layout: ``<path>/<namespace hex>/<key hex[:2]>/<key hex>.kv``; temporaries are
``<final>.<pid>.<n>.tmp`` in the same directory so the rename is atomic.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvoffload.keys import OffloadKey
from kvoffload.policies import create_cache_policy
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
)
from kvoffload.tiers.disk.index import DiskIndex, IndexEntry
from kvoffload.tiers.disk.io import FileLayer, read_full, write_all
from kvoffload.tiers.disk.records import (
    HEADER_BYTES,
    MAX_KEY_BYTES,
    NAMESPACE_BYTES,
    RecordError,
    checksum_function,
    decode_header,
    encode_header,
    resolve_checksum,
)

DURABILITIES = ("none", "rename", "fsync")
RECORD_SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
_FREE_SPACE_REFRESH_S = 0.25


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def namespace_digest(namespace: bytes | str) -> bytes:
    """The 32 bytes a record carries: a ``namespace_fingerprint`` as is, anything else hashed."""
    if isinstance(namespace, str):
        namespace = namespace.encode()
    if not isinstance(namespace, (bytes, bytearray)):
        raise TypeError(f"namespace must be bytes or str, got {type(namespace).__name__}")
    if len(namespace) == NAMESPACE_BYTES:
        return bytes(namespace)
    return hashlib.sha256(b"kvoffload-disk-ns\x00" + bytes(namespace)).digest()


@dataclass
class _Job:
    job_id: int
    kind: JobKind
    keys: tuple[OffloadKey, ...]
    generation: int
    ok: list[bool]
    started: float
    reasons: dict[int, str] = field(default_factory=dict)
    remaining: int = 0
    nbytes: int = 0
    evicted: list[OffloadKey] = field(default_factory=list)
    written: list[int] = field(default_factory=list)  # indices of keys written, to publish


class DiskTier(Tier):
    """Records of host slots as files under ``path``, bounded by bytes and free space.

    Args:
        memory: the host slots puts read from and gets write into.
        path: the tier's root directory (created if missing); each namespace gets a subfolder.
        capacity_bytes: the byte budget for records (header plus payload), >= one record.
        namespace: a ``namespace_fingerprint`` (model, dtype, layout, ...) or any bytes/str;
            records of other namespaces are neither seen nor touched.
        policy: eviction policy name in the registry (or with ``policy_module_path``).
        policy_params: the policy's keyword tunables.
        durability: ``"none"`` (write in place, no rename: fastest, a crash can leave a torn
            record that the next scan deletes), ``"rename"`` (temporary name, then rename: a
            killed process never leaves a torn record under a final name) or ``"fsync"``
            (also fsync the file before and the directory after the rename: survives power loss).
        min_free_bytes: keep at least this many bytes free on the filesystem (the budget
            shrinks when other writers fill the disk).
        io_threads: I/O threads; each key of a job is its own task.
        checksum: ``"auto"`` (xxh3 when installed, else crc32), ``"xxh3"`` or ``"crc32"``.
        verify_on_scan: also checksum every payload during the start-up scan (slower restart;
            reads verify anyway).
        files: the file layer (tests swap in one that injects faults).
    """

    name = "disk"

    def __init__(
        self,
        memory: SlotMemory,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        *,
        namespace: bytes | str = b"",
        policy: str = "lru",
        policy_params: Mapping[str, object] | None = None,
        policy_module_path: str | None = None,
        durability: str = "rename",
        min_free_bytes: int = 0,
        io_threads: int = 4,
        checksum: str = "auto",
        verify_on_scan: bool = False,
        files: FileLayer | None = None,
    ) -> None:
        super().__init__(memory)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
        if durability not in DURABILITIES:
            raise ValueError(f"durability must be one of {DURABILITIES}, got {durability!r}")
        if files is not None and not isinstance(files, FileLayer):
            raise TypeError(f"files must be a FileLayer, got {type(files).__name__}")
        self.record_bytes = HEADER_BYTES + memory.slot_bytes
        self.capacity_bytes = _check_int("capacity_bytes", capacity_bytes, self.record_bytes)
        self.min_free_bytes = _check_int("min_free_bytes", min_free_bytes, 0)
        self.durability = durability
        self._checksum_kind = resolve_checksum(checksum)
        fn = checksum_function(self._checksum_kind)
        if fn is None:  # resolve_checksum only returns kinds available here
            raise ValueError(f"checksum {checksum!r} is not available in this environment")
        self._checksum_fn = fn
        self.verify_on_scan = bool(verify_on_scan)
        self.files = files if files is not None else FileLayer()
        self.namespace = namespace_digest(namespace)
        self.root = os.fspath(path)
        self.directory = os.path.join(self.root, self.namespace.hex()[:32])
        self.files.makedirs(self.directory)
        policy_obj = create_cache_policy(
            policy,
            self.capacity_bytes // self.record_bytes,
            module_path=policy_module_path,
            params=dict(policy_params or {}),
        )
        self._index = DiskIndex(policy_obj)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._job_ids = itertools.count(1)
        self._temp_ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._done: deque[TierResult] = deque()
        self._closed = False
        self._made_dirs: set[str] = set()
        self._limit = self.capacity_bytes
        self._limit_at = -1.0
        self._local = threading.local()
        self._stats: dict[str, float] = dict.fromkeys(
            (
                "lookups",
                "hits",
                "bytes_read",
                "bytes_written",
                "read_seconds",
                "write_seconds",
                "gets",
                "get_hits",
                "puts",
                "stored",
                "evictions",
                "deletes",
                "corrupt_records",
                "torn_records",
                "temp_removed",
                "foreign_records",
                "scanned_records",
                "scan_seconds",
            ),
            0.0,
        )
        self._drops: dict[str, int] = {}
        self._get_failures: dict[str, int] = {}
        self._health = TierHealth(ok=True)
        self._pool = ThreadPoolExecutor(
            max_workers=_check_int("io_threads", io_threads, 1),
            thread_name_prefix="kvoffload-disk",
        )
        self._recover()

    # ----------------------------------------------------------------- the contract

    @property
    def capabilities(self) -> TierCapabilities:
        return TierCapabilities(
            medium=Medium.DISK,
            shared=False,
            persistent=True,
            max_batch=0,
            max_value_bytes=self.memory.slot_bytes,
            supports_delete=True,
        )

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        with self._lock:
            out = []
            hits = 0
            for key in keys:
                entry = self._index.get(key)
                if entry is not None and entry.status.ref_cnt >= 0 and not entry.doomed:
                    out.append(Presence.HIT)
                    hits += 1
                else:
                    out.append(Presence.MISS)
            self._stats["lookups"] += len(out)
            self._stats["hits"] += hits
            return out

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys_t, slots_t = self._check_batch(keys, slots)
        with self._lock:
            job = self._new_job(JobKind.PUT, keys_t, generation)
            self._stats["puts"] += len(keys_t)
            if self._closed:
                self._fail_all(job, "closed")
                return self._maybe_finish(job)
            limit = self._effective_limit()
            batch = set(keys_t)
            seen: set[OffloadKey] = set()
            tasks: list[tuple[int, OffloadKey, int, IndexEntry]] = []
            deletions: list[IndexEntry] = []
            for i, (key, slot) in enumerate(zip(keys_t, slots_t, strict=True)):
                reason = self._bad_key(key)
                if reason is None and key in seen:
                    reason = "duplicate"
                if reason is not None:
                    self._drop(job, i, reason)
                    continue
                seen.add(key)
                existing = self._index.get(key)
                if existing is not None:
                    if existing.status.ref_cnt >= 0 and not existing.doomed:
                        job.ok[i] = True  # records are immutable: already stored
                    else:
                        self._drop(job, i, "in_flight")
                    continue
                victims = self._index.make_room(self.record_bytes, limit, batch)
                if victims is None:
                    self._drop(job, i, "no_space")
                    continue
                for victim_key, victim in victims:
                    job.evicted.append(victim_key)
                    deletions.append(victim)
                self._stats["evictions"] += len(victims)
                entry = self._index.begin_write(key, self._record_path(key), self.record_bytes)
                tasks.append((i, key, slot, entry))
            job.remaining = len(tasks) + len(deletions)
            for victim in deletions:
                self._pool.submit(self._run_unlink, job, victim.path)
            for i, key, slot, entry in tasks:
                self._pool.submit(self._run_put, job, i, key, slot, entry)
            return self._maybe_finish(job)

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys_t, slots_t = self._check_batch(keys, slots)
        with self._lock:
            job = self._new_job(JobKind.GET, keys_t, generation)
            self._stats["gets"] += len(keys_t)
            if self._closed:
                self._fail_all(job, "closed")
                return self._maybe_finish(job)
            tasks = []
            hit_keys = []
            for i, (key, slot) in enumerate(zip(keys_t, slots_t, strict=True)):
                entry = self._index.begin_read(key)
                if entry is None:
                    self._get_failed(job, i, "missing")
                    continue
                hit_keys.append(key)
                tasks.append((i, key, slot, entry))
            if hit_keys:
                self._index.policy.touch(reversed(hit_keys))
            job.remaining = len(tasks)
            for i, key, slot, entry in tasks:
                self._pool.submit(self._run_get, job, i, key, slot, entry)
            return self._maybe_finish(job)

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        keys_t = tuple(keys)
        with self._lock:
            job = self._new_job(JobKind.DELETE, keys_t, generation)
            if self._closed:
                self._fail_all(job, "closed")
                return self._maybe_finish(job)
            paths = []
            for i, key in enumerate(keys_t):
                entry = self._index.get(key)
                if entry is None:
                    job.ok[i] = True  # absent is gone
                    continue
                removed = self._index.remove_ready(key)
                if removed is None:
                    job.reasons[i] = "busy"
                    continue
                job.ok[i] = True
                self._stats["deletes"] += 1
                paths.append(removed.path)
            job.remaining = len(paths)
            for path in paths:
                self._pool.submit(self._run_unlink, job, path)
            return self._maybe_finish(job)

    def poll(self) -> list[TierResult]:
        with self._lock:
            out = list(self._done)
            self._done.clear()
            return out

    def drain(self, timeout: float) -> bool:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {type(timeout).__name__}")
        deadline = time.monotonic() + max(0.0, float(timeout))
        with self._idle:
            while self._jobs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
            return True

    def health(self) -> TierHealth:
        return self._health

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._stats)
            out["used_bytes"] = float(self._index.used_bytes)
            out["reserved_bytes"] = float(self._index.reserved_bytes)
            out["capacity_bytes"] = float(self.capacity_bytes)
            out["effective_capacity_bytes"] = float(self._limit)
            out["records"] = float(len(self._index))
            out["inflight_jobs"] = float(len(self._jobs))
            for reason, n in self._drops.items():
                out[f"dropped_{reason}"] = float(n)
            for reason, n in self._get_failures.items():
                out[f"get_failed_{reason}"] = float(n)
            return out

    def scan(self) -> Iterator[ScannedBlock]:
        """The records the index holds: what the start-up scan found plus stores since."""
        with self._lock:
            found = [
                ScannedBlock(key, entry.nbytes, entry.mtime)
                for key, entry in self._index.items()
                if entry.status.ref_cnt >= 0 and not entry.doomed
            ]
        return iter(found)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel queued I/O (reported as ``"cancelled"``), wait for running I/O, stop threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.drain(timeout)
        self._pool.shutdown(wait=True, cancel_futures=False)

    # ----------------------------------------------------------------- helpers

    def _check_batch(
        self, keys: Sequence[OffloadKey], slots: Sequence[int]
    ) -> tuple[tuple[OffloadKey, ...], tuple[int, ...]]:
        keys_t, slots_t = tuple(keys), tuple(slots)
        if len(keys_t) != len(slots_t):
            raise ValueError(f"keys and slots must pair up, got {len(keys_t)} and {len(slots_t)}")
        n = self.memory.num_slots
        for slot in slots_t:
            if isinstance(slot, bool) or not isinstance(slot, int):
                raise TypeError(f"slots must be ints, got {type(slot).__name__}")
            if not 0 <= slot < n:
                raise ValueError(f"slot must be in [0, {n}), got {slot}")
        return keys_t, slots_t

    @staticmethod
    def _bad_key(key: object) -> str | None:
        if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
            return "bad_key"
        return None

    def _new_job(self, kind: JobKind, keys: tuple[OffloadKey, ...], generation: int) -> _Job:
        job = _Job(
            job_id=next(self._job_ids),
            kind=kind,
            keys=keys,
            generation=generation,
            ok=[False] * len(keys),
            started=time.perf_counter(),
        )
        self._jobs[job.job_id] = job
        return job

    def _fail_all(self, job: _Job, reason: str) -> None:
        for i in range(len(job.keys)):
            job.ok[i] = False
            job.reasons[i] = reason

    def _drop(self, job: _Job, i: int, reason: str) -> None:
        job.reasons[i] = reason
        self._drops[reason] = self._drops.get(reason, 0) + 1

    def _get_failed(self, job: _Job, i: int, reason: str) -> None:
        job.reasons[i] = reason
        self._get_failures[reason] = self._get_failures.get(reason, 0) + 1

    def _maybe_finish(self, job: _Job) -> int:
        """Report the job once its last task is done (call with the lock held)."""
        if job.remaining == 0 and job.job_id in self._jobs:
            del self._jobs[job.job_id]
            if job.written:
                self._index.publish([job.keys[i] for i in sorted(job.written, reverse=True)])
            self._done.append(
                TierResult(
                    job_id=job.job_id,
                    kind=job.kind,
                    keys=job.keys,
                    ok=tuple(job.ok),
                    generation=job.generation,
                    nbytes=job.nbytes,
                    seconds=time.perf_counter() - job.started,
                    reasons=dict(job.reasons),
                    evicted=tuple(job.evicted),
                )
            )
            if not self._jobs:
                self._idle.notify_all()
        return job.job_id

    def _record_path(self, key: bytes) -> str:
        name = key.hex()
        return os.path.join(self.directory, name[:2], name + RECORD_SUFFIX)

    def _effective_limit(self) -> int:
        """min(budget, what the filesystem can still take above the free-space floor)."""
        now = time.monotonic()
        if now - self._limit_at >= _FREE_SPACE_REFRESH_S:
            self._limit_at = now
            try:
                free = self.files.free_bytes(self.directory)
            except OSError as exc:
                self._health = TierHealth(ok=False, reason=f"statvfs failed: {exc}")
                return self._limit
            committed = self._index.used_bytes + self._index.reserved_bytes
            headroom = committed + free - self.min_free_bytes
            self._limit = max(0, min(self.capacity_bytes, headroom))
        return self._limit

    def _header_buffer(self) -> memoryview:
        buf = getattr(self._local, "header", None)
        if buf is None:
            buf = memoryview(bytearray(HEADER_BYTES))
            self._local.header = buf
        return buf

    def _ensure_dir(self, path: str) -> None:
        parent = os.path.dirname(path)
        if parent not in self._made_dirs:
            self.files.makedirs(parent)
            self._made_dirs.add(parent)

    # ----------------------------------------------------------------- I/O tasks (threads)

    def _run_put(self, job: _Job, i: int, key: OffloadKey, slot: int, entry: IndexEntry) -> None:
        reason: str | None = "cancelled"
        t0 = time.perf_counter()
        mtime = 0.0
        if not self._closed:
            try:
                mtime = self._write_record(key, slot, entry.path)
                reason = None
            except OSError as exc:
                reason = "no_space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "io_error"
            except Exception:
                reason = "io_error"
        seconds = time.perf_counter() - t0
        with self._lock:
            self._index.end_write(key, reason is None, mtime)
            if reason is None:
                job.ok[i] = True
                job.written.append(i)
                job.nbytes += self.memory.slot_bytes
                self._stats["stored"] += 1
                self._stats["bytes_written"] += self.memory.slot_bytes
            else:
                self._drop(job, i, reason)
            self._stats["write_seconds"] += seconds
            job.remaining -= 1
            self._maybe_finish(job)

    def _write_record(self, key: OffloadKey, slot: int, path: str) -> float:
        view = self.memory.slot_view(slot)
        checksum = self._checksum_fn(view)
        header = encode_header(key, self.namespace, view.nbytes, self._checksum_kind, checksum)
        self._ensure_dir(path)
        files = self.files
        target = path
        if self.durability != "none":
            target = f"{path}.{os.getpid()}.{next(self._temp_ids)}{TEMP_SUFFIX}"
        fd = files.open_new(target) if target != path else self._open_in_place(path)
        try:
            try:
                write_all(files, fd, [memoryview(header), view])
                if self.durability == "fsync":
                    files.fsync(fd)
            finally:
                files.close(fd)
            if target != path:
                files.replace(target, path)
                if self.durability == "fsync":
                    files.fsync_dir(os.path.dirname(path))
        except BaseException:
            with contextlib.suppress(OSError):
                files.unlink(target)
            raise
        return time.time()

    def _open_in_place(self, path: str) -> int:
        try:
            return self.files.open_new(path)
        except FileExistsError:
            self.files.unlink(path)  # a leftover the index does not know (e.g. torn)
            return self.files.open_new(path)

    def _run_get(self, job: _Job, i: int, key: OffloadKey, slot: int, entry: IndexEntry) -> None:
        reason: str | None = "cancelled"
        t0 = time.perf_counter()
        if not self._closed:
            try:
                reason = self._read_record(key, slot, entry.path)
            except OSError as exc:
                reason = "missing" if exc.errno == errno.ENOENT else "io_error"
            except Exception:
                reason = "io_error"
        seconds = time.perf_counter() - t0
        bad = reason in ("corrupt", "torn", "missing")
        delete_path = None
        with self._lock:
            doomed = self._index.end_read(key, corrupt=bad)
            if doomed is not None and reason != "missing":
                delete_path = doomed.path
            if reason is None:
                job.ok[i] = True
                job.nbytes += self.memory.slot_bytes
                self._stats["get_hits"] += 1
                self._stats["bytes_read"] += self.memory.slot_bytes
            else:
                if reason in ("corrupt", "torn"):
                    self._stats["corrupt_records"] += 1
                self._get_failed(job, i, reason)
            self._stats["read_seconds"] += seconds
            if delete_path is not None:
                job.remaining += 1
                self._pool.submit(self._run_unlink, job, delete_path)
            job.remaining -= 1
            self._maybe_finish(job)

    def _read_record(self, key: OffloadKey, slot: int, path: str) -> str | None:
        """Read into the slot and verify; the reason it failed, or ``None``."""
        view = self.memory.slot_view(slot)
        header_buf = self._header_buffer()
        files = self.files
        fd = files.open_read(path)
        try:
            n = read_full(files, fd, [header_buf, view])
        finally:
            files.close(fd)
        if n != HEADER_BYTES + view.nbytes:
            return "torn"
        try:
            header = decode_header(header_buf)
        except RecordError:
            return "corrupt"
        if header.key != key or header.namespace != self.namespace:
            return "corrupt"
        if header.payload_len != view.nbytes:
            return "corrupt"
        fn = checksum_function(header.checksum_kind)
        if fn is None:
            return "unverifiable"
        if fn(view) != header.payload_checksum:
            return "corrupt"
        return None

    def _run_unlink(self, job: _Job, path: str) -> None:
        try:
            self.files.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            with self._lock:
                self._stats["unlink_errors"] = self._stats.get("unlink_errors", 0.0) + 1
        with self._lock:
            job.remaining -= 1
            self._maybe_finish(job)

    # ----------------------------------------------------------------- warm restart

    def _recover(self) -> None:
        """Rebuild the index from the directory, oldest record first (seeds the policy)."""
        t0 = time.perf_counter()
        found: list[tuple[float, OffloadKey, str, int]] = []
        for sub in self._list(self.directory):
            if not sub.is_dir(follow_symlinks=False):
                continue
            self._made_dirs.add(sub.path)
            for item in self._list(sub.path):
                self._consider(item, found)
        found.sort(key=lambda f: (f[0], f[1]))
        with self._lock:
            for mtime, key, path, nbytes in found:
                self._index.add_ready(key, path, nbytes, mtime)
            self._stats["scanned_records"] = float(len(found))
            over = self._index.make_room(0, self._effective_limit(), ())
            if over is None:  # cannot happen with nothing pinned; keep the scan result
                over = []
        for _key, entry in over:
            self._unlink_quietly(entry.path)
        with self._lock:
            self._stats["evictions"] += len(over)
            self._stats["scan_seconds"] = time.perf_counter() - t0

    def _list(self, path: str) -> list[os.DirEntry[str]]:
        try:
            return list(self.files.scandir(path))
        except OSError:
            return []

    def _consider(
        self, item: os.DirEntry[str], found: list[tuple[float, OffloadKey, str, int]]
    ) -> None:
        name = item.name
        if name.endswith(TEMP_SUFFIX):
            self._unlink_quietly(item.path)
            self._stats["temp_removed"] += 1
            return
        if not name.endswith(RECORD_SUFFIX):
            self._stats["foreign_records"] += 1  # not ours: leave it alone
            return
        key = self._check_record(item)
        if key is None:
            self._unlink_quietly(item.path)
            self._stats["torn_records"] += 1
            return
        found.append((item.stat().st_mtime, key, item.path, self.record_bytes))

    def _check_record(self, item: os.DirEntry[str]) -> OffloadKey | None:
        """The record's key if its header, name and size are right (and payload if asked)."""
        try:
            if item.stat(follow_symlinks=False).st_size != self.record_bytes:
                return None
            fd = self.files.open_read(item.path)
            try:
                header_buf = self._header_buffer()
                if read_full(self.files, fd, [header_buf]) != HEADER_BYTES:
                    return None
                header = decode_header(header_buf)
                if header.namespace != self.namespace:
                    return None
                if header.payload_len != self.memory.slot_bytes:
                    return None
                if item.name != header.key.hex() + RECORD_SUFFIX:
                    return None
                if self.verify_on_scan:
                    fn = checksum_function(header.checksum_kind)
                    payload = bytearray(header.payload_len)
                    n = read_full(self.files, fd, [memoryview(payload)], HEADER_BYTES)
                    if (
                        fn is None
                        or n != header.payload_len
                        or fn(payload) != (header.payload_checksum)
                    ):
                        return None
            finally:
                self.files.close(fd)
        except (OSError, RecordError):
            return None
        return OffloadKey(header.key)

    def _unlink_quietly(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.files.unlink(path)


__all__ = ["DURABILITIES", "DiskTier", "namespace_digest"]
