"""``DiskTier``: a bounded, crash-safe, checksummed store of host slots on a local filesystem.

What it fixes in the peers (``reference/tiering.md`` §1.5, §1.11, §2.5): a byte budget and a
free-space floor (vLLM's fs tier has neither and never deletes a file), eviction by any registry
policy with in-flight records pinned, self-describing records whose header is written only after
the payload (optionally with write barriers), a warm restart that rebuilds the index from the
file (the LMCache and SGLang restart misses) and erases torn records, a checksum verified on
every read (a bad record is a counted miss, never data), and per-key I/O tasks on a thread pool
so one large batch uses every thread (vLLM runs a job serially on one thread).

Layout: one arena file per namespace and block size, ``<path>/<namespace hex>/arena-<slot
bytes>.v2.kv`` (the record format's version is in the name; a format 1 arena, ``arena-<slot
bytes>.kv``, is refused: never read nor touched, its size reported as ``legacy_arena_bytes``),
cut into slots of ``4 KiB header page + slot_bytes``, then the last slot's 64-byte commit
stamp. Every record of a tier is one host slot, so all records are the same size: a freed
slot is reused in place and nothing ever needs compaction (why this is not an append-only
log), and no file is created per record (a file per record was built first: creating an
inode costs milliseconds, see ``docs/benchmarks.md``).

A write is ordered so that a commit stamp after the payload commits the record, the guarantee
a temporary name plus rename gives a file (``records`` has the layout): in file order a record
is header, payload, stamp, and the stamp names its header's write, so one sequential write of
a run of adjacent records (1) replaces each slot's header, which kills the old record, (2)
writes its payload, (3) writes its stamp. A process killed at any point leaves a slot that is
empty, holds the old record whole (killed before 1), or holds the new one whole; a torn payload
under a committed header cannot arise, and the checksums catch it anyway. Format 1 needed one
more write per record (old header zeroed with the payload, then each header on its own); a
small write costs a large share of a whole block's write (``docs/benchmarks.md``), and each is
also a GIL hand-off for the I/O thread.

Warm decisions: a clean ``close`` saves the eviction policy's state (order, frequencies,
ghosts; ``kvoffload.policies.state``, no pickle) beside the arena as ``policy-<slot
bytes>.v2.json``. The next start reads it after the scan, reconciles it with the records it
found and consumes it, so a restarted host evicts what the running one would have, not
oldest-written first. A state of another policy or budget, or one that does not decode, is
ignored and counted (``policy_state_ignored``); after a crash there is none and the scan's
oldest-first seeding stands.

One writer per arena: a tier takes an exclusive ``flock`` on ``arena-<slot bytes>.v2.lock``
beside its arena when it opens and drops it at ``close`` (the kernel drops it when the process
dies, so a crash never leaves the arena locked). Two tiers on one arena would hand out the
same slots and then erase each other's records as torn or corrupt, losing everything with the
disk blamed, so a second opener, in this process or another, is refused with
:class:`DiskTierInUseError` naming the path and the holder's pid.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvoffload._checks import check_bool, check_int
from kvoffload.keys import OffloadKey
from kvoffload.policies import create_cache_policy
from kvoffload.policies.state import export_policy_state, restore_policy_state
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
    FORMAT_VERSION,
    HEADER_BYTES,
    MAX_KEY_BYTES,
    NAMESPACE_BYTES,
    STAMP_BYTES,
    RecordError,
    RecordHeader,
    checksum_function,
    decode_header,
    encode_header_into,
    encode_stamp_into,
    is_empty,
    resolve_checksum,
    stamp_commits,
)

logger = logging.getLogger(__name__)

DURABILITIES = ("none", "rename", "fsync")
_FREE_SPACE_REFRESH_S = 0.25
#: Least seconds between two WARNING lines about failed stores (the counts add up between).
DROP_WARNING_INTERVAL_S = 60.0
#: Drop reasons that are the caller's or the job's own business, never worth a warning.
_QUIET_DROPS = frozenset({"in_flight", "duplicate", "cancelled", "closed"})
_ZERO_FIELDS = memoryview(bytes(HEADER_BYTES - STAMP_BYTES))  # a header page after its stamp
_MAX_RUN = 256  # records per vectored call (two buffers each, under IOV_MAX = 1024)
_MIN_PUT_TASK_BYTES = 4 << 20  # a put job is not split into tasks smaller than this
_MIN_GET_TASK_BYTES = 1 << 20  # nor a get job below this (jobs in flight keep threads busy)


class DiskTierInUseError(ValueError):
    """Another tier (this process or another) holds the arena this one would open."""


def _lock_arena(path: str) -> int:
    """Open ``path`` and take its exclusive lock, writing our pid in it; the lock's fd.

    Raises :class:`DiskTierInUseError` naming the holder when another open file holds it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        except OSError:
            holder = "unknown"
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise DiskTierInUseError(
            f"disk tier path {os.path.dirname(path)} is in use by pid {holder} (lock {path}): "
            "one writer per directory; give each process its own path or namespace, or "
            "close the other tier first"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:  # the pid only names the holder in a refusal; the lock is what counts
        pass
    return fd


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


class _Item:
    """One key of a job: its index in the job, host slot, index entry and arena slot.

    A plain ``__slots__`` class, not a frozen dataclass: one is built per key of every job,
    and a frozen dataclass's ``__init__`` costs several times more.
    """

    __slots__ = ("arena", "entry", "index", "key", "slot")

    def __init__(self, index: int, key: OffloadKey, slot: int, entry: IndexEntry) -> None:
        self.index = index
        self.key = key
        self.slot = slot
        self.entry = entry
        self.arena = entry.slot


class DiskTier(Tier):
    """Records of host slots in an arena file under ``path``, bounded by bytes and free space.

    Args:
        memory: the host slots puts read from and gets write into.
        path: the tier's root directory (created if missing); each namespace gets a subfolder.
        capacity_bytes: the byte budget for records (4 KiB header page plus payload each), at
            least one record; the arena file never grows past it by more than the last
            slot's 64-byte commit stamp.
        namespace: a ``namespace_fingerprint`` (model, dtype, layout, ...) or any bytes/str;
            records of other namespaces are neither seen nor touched.
        policy: eviction policy name in the registry (or with ``policy_module_path``).
        policy_params: the policy's keyword tunables.
        durability: ``"none"`` (no promise after a kill: a torn record, should one be left,
            is a counted miss through its checksum; it writes as ``rename`` does today, one
            write per run of records), ``"rename"`` (the default: header, payload, then
            commit stamp in one sequential write per run of adjacent records, so a killed
            process never leaves a torn record; the name is the config value users of
            tmp-and-rename file tiers know, with the same guarantee) or ``"fsync"`` (the steps
            apart with ``fdatasync`` barriers: old headers of reused slots zeroed, headers and
            payloads, then the stamps; survives power loss).
        min_free_bytes: keep at least this many bytes free on the filesystem (the budget
            shrinks when other writers fill the disk).
        io_threads: I/O threads; each key of a job is its own task.
        checksum: ``"auto"`` (xxh3 when installed, else crc32), ``"xxh3"`` or ``"crc32"``.
        verify_on_scan: also checksum every payload during the start-up scan (slower restart;
            reads verify anyway).
        save_policy_state: at a clean ``close``, save the policy's state for the next start
            (its time and size grow with the records held); a saved state is read either way.
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
        save_policy_state: bool = True,
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
        self.capacity_bytes = check_int("capacity_bytes", capacity_bytes, self.record_bytes)
        self.min_free_bytes = check_int("min_free_bytes", min_free_bytes, 0)
        io_threads = check_int("io_threads", io_threads, 1)
        self._threads = io_threads
        self.durability = durability
        self._checksum_kind = resolve_checksum(checksum)
        fn = checksum_function(self._checksum_kind)
        if fn is None:  # resolve_checksum only returns kinds available here
            raise ValueError(f"checksum {checksum!r} is not available in this environment")
        self._checksum_fn = fn
        self.verify_on_scan = check_bool("verify_on_scan", verify_on_scan)
        self.save_policy_state = check_bool("save_policy_state", save_policy_state)
        self.files = files if files is not None else FileLayer()
        self.namespace = namespace_digest(namespace)
        self.root = os.fspath(path)
        self.directory = os.path.join(self.root, self.namespace.hex()[:32])
        # the slot size is part of the name: a tier of another block size is another arena
        self.arena_path = os.path.join(
            self.directory, f"arena-{memory.slot_bytes}.v{FORMAT_VERSION}.kv"
        )
        # format 1 arenas (no version in the name) are refused: neither read nor touched
        self.legacy_arena_path = os.path.join(self.directory, f"arena-{memory.slot_bytes}.kv")
        # the policy's state at the last clean close (order, frequencies, ghosts)
        self.policy_state_path = os.path.join(
            self.directory, f"policy-{memory.slot_bytes}.v{FORMAT_VERSION}.json"
        )
        # one writer per arena: held from before the scan until close
        self.lock_path = os.path.join(
            self.directory, f"arena-{memory.slot_bytes}.v{FORMAT_VERSION}.lock"
        )
        max_slots = self.capacity_bytes // self.record_bytes
        policy_obj = create_cache_policy(
            policy, max_slots, module_path=policy_module_path, params=dict(policy_params or {})
        )
        self._index = DiskIndex(policy_obj, max_slots)
        self._lock = threading.Lock()
        # one store write in the kernel at a time: buffered writes to one file serialise on its
        # inode lock anyway, where waiters spin on a CPU the other threads' checksums could use
        self._write_lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._job_ids = itertools.count(1)
        self._jobs: dict[int, _Job] = {}
        self._done: deque[TierResult] = deque()
        self._closed = False
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
                "scanned_records",
                "scan_seconds",
                "erase_errors",
                "unreadable_slots",
                "legacy_arena_bytes",
                "policy_state_restored",
                "policy_state_ignored",
                "policy_state_errors",
            ),
            0.0,
        )
        # every record write gets its own id, named by its header and its commit stamp, so
        # an old stamp can never commit a new header (random start: ids differ across runs)
        self._write_ids = itertools.count(int.from_bytes(os.urandom(8), "little") >> 2)
        self._drops: dict[str, int] = {}
        self._unwarned: dict[str, int] = {}  # drops since the last warning, by reason
        self._warned_at = -math.inf
        self._get_failures: dict[str, int] = {}
        self._health = TierHealth(ok=True)
        self.files.makedirs(self.directory)
        self._lock_fd = _lock_arena(self.lock_path)
        try:
            created = not os.path.exists(self.arena_path)
            with contextlib.suppress(OSError):
                self._stats["legacy_arena_bytes"] = float(os.path.getsize(self.legacy_arena_path))
            self._fd = self.files.open_arena(self.arena_path)
            if created and durability == "fsync":
                self.files.fsync_dir(self.directory)
        except BaseException:
            os.close(self._lock_fd)  # closing the fd drops the lock
            raise
        self._pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kvoff-disk")
        try:
            self._recover()
        except BaseException:
            self._pool.shutdown(wait=True)
            with contextlib.suppress(OSError):
                self.files.close(self._fd)
            os.close(self._lock_fd)
            raise

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
            # a set of keys seen so far is only needed when the batch repeats one
            seen: set[OffloadKey] | None = set() if len(batch) != len(keys_t) else None
            index, record_bytes = self._index, self.record_bytes
            tasks: list[_Item] = []
            evictions = 0
            for i, (key, slot) in enumerate(zip(keys_t, slots_t, strict=True)):
                if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
                    self._drop(job, i, "bad_key")
                    continue
                if seen is not None:
                    if key in seen:
                        self._drop(job, i, "duplicate")
                        continue
                    seen.add(key)
                existing = index.get(key)
                if existing is not None:
                    if existing.status.ref_cnt >= 0 and not existing.doomed:
                        job.ok[i] = True  # records are immutable: already stored
                    else:
                        self._drop(job, i, "in_flight")
                    continue
                taken = index.used_bytes + index.reserved_bytes + index.retired_bytes
                if taken + record_bytes <= limit:
                    entry = index.begin_write(key, record_bytes)  # fits: nothing to evict
                else:
                    victims = index.make_room(record_bytes, limit, batch)
                    entry = None if victims is None else index.begin_write(key, record_bytes)
                    if victims:
                        job.evicted.extend(victim_key for victim_key, _ in victims)
                        evictions += len(victims)
                if entry is None:
                    self._drop(job, i, "no_space")
                    continue
                tasks.append(_Item(i, key, slot, entry))
            self._stats["evictions"] += evictions
            job.remaining = len(tasks)
            for chunk in self._chunks(tasks, _MIN_PUT_TASK_BYTES):
                self._pool.submit(self._run_put, job, chunk)
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
            tasks: list[_Item] = []
            hit_keys = []
            for i, (key, slot) in enumerate(zip(keys_t, slots_t, strict=True)):
                entry = self._index.begin_read(key)
                if entry is None:
                    self._get_failed(job, i, "missing")
                    continue
                hit_keys.append(key)
                tasks.append(_Item(i, key, slot, entry))
            if hit_keys:
                self._index.policy.touch(reversed(hit_keys))
            job.remaining = len(tasks)
            for chunk in self._chunks(tasks, _MIN_GET_TASK_BYTES):
                self._pool.submit(self._run_get, job, chunk)
            return self._maybe_finish(job)

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        keys_t = tuple(keys)
        with self._lock:
            job = self._new_job(JobKind.DELETE, keys_t, generation)
            if self._closed:
                self._fail_all(job, "closed")
                return self._maybe_finish(job)
            erase = []
            for i, key in enumerate(keys_t):
                if self._index.get(key) is None:
                    job.ok[i] = True  # absent is gone
                    continue
                removed = self._index.remove_ready(key)
                if removed is None:
                    job.reasons[i] = "busy"
                    continue
                job.ok[i] = True
                self._stats["deletes"] += 1
                erase.append(removed.slot)
            job.remaining = len(erase)
            for slot in erase:
                self._pool.submit(self._run_erase, job, slot)
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
        """Not ok when the filesystem cannot be queried or is below the free-space floor."""
        with self._lock:
            if self._health.ok and self._effective_limit() < self.record_bytes:
                return TierHealth(ok=False, reason="no slot fits above min_free_bytes")
            return self._health

    def stats(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._stats)
            out["used_bytes"] = float(self._index.used_bytes)
            out["reserved_bytes"] = float(self._index.reserved_bytes)
            out["capacity_bytes"] = float(self.capacity_bytes)
            out["effective_capacity_bytes"] = float(self._limit)
            out["records"] = float(len(self._index))
            out["arena_slots"] = float(self._index.high_water)
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
                ScannedBlock(key, entry.nbytes, entry.written_ns / 1e9)
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
        self._pool.shutdown(wait=True)
        try:
            self.files.close(self._fd)
            self._save_policy_state()
        finally:
            os.close(self._lock_fd)  # the next opener may take the arena now

    def _save_policy_state(self) -> None:
        """Write the policy's state beside the arena (temporary name, then rename), so the
        next start resumes its decisions; a failure is counted, never raised at close."""
        if not self.save_policy_state:
            return
        tmp = self.policy_state_path + ".tmp"
        try:
            with self._lock:
                data = export_policy_state(self._index.policy) if len(self._index) else None
            if data is None:
                return
            with open(tmp, "wb") as out:
                out.write(data)
                if self.durability == "fsync":
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, self.policy_state_path)
            if self.durability == "fsync":
                self.files.fsync_dir(self.directory)
        except Exception:  # an out-of-tree policy may not export; the disk, not be writable
            self._stats["policy_state_errors"] += 1
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _load_policy_state(self) -> None:
        """After the scan: adopt the state saved at the last clean close, if it is this
        policy's at this capacity (else the scan's oldest-first seeding stays). The file is
        consumed, so a later crash restarts from the scan, never from a stale order."""
        try:
            with open(self.policy_state_path, "rb") as saved:
                data = saved.read()
        except FileNotFoundError:
            return
        except OSError:
            self._stats["policy_state_errors"] += 1
            return
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.policy_state_path)
        current = self._index.policy
        try:
            restored = restore_policy_state(data)
        except (ValueError, TypeError, RecursionError):
            self._stats["policy_state_ignored"] += 1
            return
        if type(restored) is not type(current) or restored.cache_capacity != current.cache_capacity:
            self._stats["policy_state_ignored"] += 1  # another policy, budget or block size
            return
        try:
            self._index.adopt_policy(restored)
        except ValueError:  # a policy without a block table: nothing to reconcile with
            self._stats["policy_state_ignored"] += 1
            return
        self._stats["policy_state_restored"] = 1.0

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
        if reason in _QUIET_DROPS:
            return
        self._unwarned[reason] = self._unwarned.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._warned_at < DROP_WARNING_INTERVAL_S:
            return
        self._warned_at = now
        counts = ", ".join(f"{why} {n}" for why, n in sorted(self._unwarned.items()))
        self._unwarned.clear()
        logger.warning(
            "disk tier %s: stores failed (%s) since the last warning; %d records, %d bytes "
            "usable (budget %d, min_free_bytes %d); next warning in %.0f s at the earliest",
            self.directory,
            counts,
            len(self._index),
            self._limit,
            self.capacity_bytes,
            self.min_free_bytes,
            DROP_WARNING_INTERVAL_S,
        )

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

    def _effective_limit(self) -> int:
        """min(budget, what the filesystem can still take above the free-space floor).

        Slots below the arena's high-water mark are already allocated on disk, so only
        growth past it needs free space: the tier never takes the filesystem below the floor.
        """
        now = time.monotonic()
        if now - self._limit_at >= _FREE_SPACE_REFRESH_S:
            self._limit_at = now
            try:
                free = self.files.free_bytes(self.directory)
            except OSError as exc:
                self._health = TierHealth(ok=False, reason=f"statvfs failed: {exc}")
                return self._limit
            allocated = self._index.backed_slots * self.record_bytes
            # slots the file already holds cost no more space; only growth must stay above
            # the floor (evicting a record frees a slot, not disk space). Slots handed out but
            # never written (in flight, or their write failed) are growth, not held.
            headroom = allocated + max(0, free - self.min_free_bytes)
            self._limit = min(self.capacity_bytes, headroom)
        return self._limit

    def _header_buffer(self) -> memoryview:
        buf = getattr(self._local, "header", None)
        if buf is None:
            buf = memoryview(bytearray(HEADER_BYTES))
            self._local.header = buf
        return buf

    # ----------------------------------------------------------------- I/O tasks (threads)

    def _chunks(self, items: list[_Item], min_bytes: int) -> list[list[_Item]]:
        """A job's keys as tasks: runs of adjacent arena slots, split across the threads.

        Adjacent slots go to the file in one vectored call. A job is cut into at most about
        ``io_threads`` tasks so one large batch still uses every thread, but no task is cut
        below ``min_bytes``. Each task costs a thread hand-off, a lock round and its own
        system call, which small blocks cannot amortise. Puts use
        :data:`_MIN_PUT_TASK_BYTES` (writes into one file serialise in the kernel anyway);
        gets use the smaller :data:`_MIN_GET_TASK_BYTES` (reads of the page cache do run in
        parallel, and other jobs in flight keep the threads busy): cutting a job of small
        blocks into many small reads held loads well below one larger read per job
        (``benchmarks/disk_tier_bandwidth.py``; figures in ``docs/benchmarks.md``).
        """
        if not items:
            return []
        if any(a.arena >= b.arena for a, b in itertools.pairwise(items)):
            items = sorted(items, key=lambda it: it.arena)
        per_task = max(-(-len(items) // self._threads), -(-min_bytes // self.record_bytes))
        per_task = min(_MAX_RUN, per_task)
        chunks: list[list[_Item]] = [[items[0]]]
        last = chunks[0]
        for item in items[1:]:
            if item.arena == last[-1].arena + 1 and len(last) < per_task:
                last.append(item)
            else:
                last = [item]
                chunks.append(last)
        return chunks

    def _run_put(self, job: _Job, items: list[_Item]) -> None:
        reason: str | None = "cancelled"
        t0 = time.perf_counter()
        written_ns = 0
        if not self._closed:
            try:
                written_ns = self._write_run(items)
                reason = None
            except OSError as exc:
                reason = "no_space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "io_error"
            except Exception:
                reason = "io_error"  # a fault must be a failed key, never escape
        seconds = time.perf_counter() - t0
        with self._lock:
            if reason == "no_space":  # the disk is fuller than the last reading: read it again
                self._limit_at = -math.inf
            end_write = self._index.end_write
            if reason is None:
                ok = job.ok
                for item in items:
                    end_write(item.key, True, written_ns)
                    ok[item.index] = True
                job.written.extend(item.index for item in items)
                nbytes = len(items) * self.memory.slot_bytes
                job.nbytes += nbytes
                self._stats["stored"] += len(items)
                self._stats["bytes_written"] += nbytes
            else:
                for item in items:
                    end_write(item.key, False)
                    self._drop(job, item.index, reason)
            self._stats["write_seconds"] += seconds
            job.remaining -= len(items)
            self._maybe_finish(job)

    def _write_run(self, items: list[_Item]) -> int:
        """Write records into adjacent arena slots, each stamp after its payload.

        Under ``none`` and ``rename`` one vectored write lays down, in file order, each
        record's header page (which kills the slot's old record: its stamp no longer matches),
        its payload, then its stamp (which commits it): a killed process leaves every slot
        empty, holding its old record or holding its new one whole. Under ``fsync`` the steps
        are apart, with a barrier after each: old headers of reused slots zeroed, then headers
        and payloads with zero stamps, then the stamps. The stamp of the run's last record
        falls in the next slot's header page, before that slot's header, so the one write
        never touches a record outside the run.
        """
        written_ns = time.time_ns()
        slot_view, checksum, ids = self.memory.slot_view, self._checksum_fn, self._write_ids
        namespace, kind = self.namespace, self._checksum_kind
        n = len(items)
        # header pages of the run, back to back, then the last record's stamp
        pages = bytearray(HEADER_BYTES * n + STAMP_BYTES)
        stamps: list[tuple[int, int]] = []
        views = []
        offset = 0
        for item in items:
            view = slot_view(item.slot)
            views.append(view)
            write_id = next(ids)
            crc = encode_header_into(
                pages,
                offset,
                item.key,
                namespace,
                view.nbytes,
                kind,
                checksum(view),
                written_ns,
                write_id,
            )
            stamps.append((crc, write_id))
            offset += HEADER_BYTES
        pv = memoryview(pages)
        # the first page's stamp area is the previous slot's record's: start after it
        body: list[memoryview] = [pv[STAMP_BYTES:HEADER_BYTES], views[0]]
        for k in range(1, n):
            body += (pv[k * HEADER_BYTES : (k + 1) * HEADER_BYTES], views[k])
        body.append(pv[n * HEADER_BYTES :])
        files, fd, record_bytes = self.files, self._fd, self.record_bytes
        first = items[0].arena * record_bytes + STAMP_BYTES
        total = n * record_bytes
        if self.durability != "fsync":
            for k, (crc, write_id) in enumerate(stamps, 1):
                encode_stamp_into(pages, k * HEADER_BYTES, crc, write_id)
            with self._write_lock:
                write_all(files, fd, body, first, total)
            return written_ns
        reused = [item.arena for item in items if not item.entry.fresh]
        for arena_slot in reused:  # power loss must not find an old header over new bytes
            write_all(files, fd, (_ZERO_FIELDS,), arena_slot * record_bytes + STAMP_BYTES)
        if reused:
            files.fdatasync(fd)
        write_all(files, fd, body, first, total)
        files.fdatasync(fd)
        for k, (crc, write_id) in enumerate(stamps, 1):
            at = k * HEADER_BYTES
            encode_stamp_into(pages, at, crc, write_id)
            stamp = pv[at : at + STAMP_BYTES]
            write_all(files, fd, (stamp,), (items[k - 1].arena + 1) * record_bytes, STAMP_BYTES)
        files.fdatasync(fd)
        return written_ns

    def _run_get(self, job: _Job, items: list[_Item]) -> None:
        reasons: list[str | None] = ["cancelled"] * len(items)
        t0 = time.perf_counter()
        if not self._closed:
            try:
                reasons = self._read_run(items)
            except Exception:
                reasons = ["io_error"] * len(items)  # a fault is a failed key, never escapes
        seconds = time.perf_counter() - t0
        with self._lock:
            for item, reason in zip(items, reasons, strict=True):
                bad = reason in ("corrupt", "torn")
                doomed = self._index.end_read(item.key, corrupt=bad)
                if reason is None:
                    job.ok[item.index] = True
                    job.nbytes += self.memory.slot_bytes
                    self._stats["get_hits"] += 1
                    self._stats["bytes_read"] += self.memory.slot_bytes
                else:
                    if bad:
                        self._stats["corrupt_records"] += 1
                    self._get_failed(job, item.index, reason)
                if doomed is not None:
                    job.remaining += 1
                    self._pool.submit(self._run_erase, job, doomed.slot)
            self._stats["read_seconds"] += seconds
            job.remaining -= len(items)
            self._maybe_finish(job)

    def _read_run(self, items: list[_Item]) -> list[str | None]:
        """Read adjacent records into their host slots in one call, then verify each."""
        views = [self.memory.slot_view(item.slot) for item in items]
        header_bufs = memoryview(bytearray(HEADER_BYTES * len(items)))
        body: list[memoryview] = []
        for k, view in enumerate(views):
            body += (header_bufs[k * HEADER_BYTES : (k + 1) * HEADER_BYTES], view)
        n = read_full(self.files, self._fd, body, items[0].arena * self.record_bytes)
        out: list[str | None] = []
        for k, (item, view) in enumerate(zip(items, views, strict=True)):
            if n < (k + 1) * self.record_bytes:
                out.append("torn")
                continue
            header_buf = header_bufs[k * HEADER_BYTES : (k + 1) * HEADER_BYTES]
            out.append(self._verify(item.key, header_buf, view))
        return out

    def _verify(self, key: OffloadKey, header_buf: memoryview, view: memoryview) -> str | None:
        """Why the record read into ``view`` is not ``key``'s bytes, or ``None`` if it is."""
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

    def _run_erase(self, job: _Job, arena_slot: int) -> None:
        """Zero a deleted or corrupt record's header, then free its slot.

        Only the header's fields: the page's first bytes are the previous slot's stamp.
        """
        failed = False
        try:
            offset = arena_slot * self.record_bytes + STAMP_BYTES
            write_all(self.files, self._fd, (_ZERO_FIELDS,), offset)
            if self.durability == "fsync":
                self.files.fdatasync(self._fd)
        except Exception:
            failed = True  # the slot stays out of use: its old header might still be valid
        with self._lock:
            if failed:
                self._stats["erase_errors"] += 1
                self._index.retire_slot(self.record_bytes)
            else:
                self._index.release_slot(arena_slot)
            job.remaining -= 1
            self._maybe_finish(job)

    # ----------------------------------------------------------------- warm restart

    def _recover(self) -> None:
        """Rebuild the index from the arena's headers, oldest record first (seeds the policy).

        A record counts only with its commit stamp (the next header page's first bytes, or the
        file's tail). Torn, uncommitted or foreign headers are zeroed and counted; slots past
        the budget (it shrank) are cut off the file; records over the effective limit are
        evicted by the policy. A slot whose read fails (EIO, perhaps transient) proves nothing:
        it is skipped for this run, neither zeroed nor handed out, and so is the slot before it
        (whose stamp it holds); the next start reads both again.
        """
        t0 = time.perf_counter()
        files, fd, record_bytes = self.files, self._fd, self.record_bytes
        try:
            size = files.size(fd)
        except OSError:
            size = 0
        whole = size // record_bytes
        max_slots = self._index.max_slots
        slots = min(whole, max_slots)
        if size % record_bytes not in (0, STAMP_BYTES):
            self._stats["torn_records"] += 1  # a trailing partial slot: a write cut short
        found: list[tuple[int, OffloadKey, int]] = []
        free: list[int] = []
        skipped: list[int] = []  # unreadable this run: out of use, untouched
        page = self._header_buffer()
        pending: tuple[int, RecordHeader] | None = None  # a header waiting for its stamp
        for arena_slot in range(slots + 1):
            offset = arena_slot * record_bytes
            want = page if arena_slot < slots else page[:STAMP_BYTES]  # the tail: a stamp
            try:
                n = read_full(files, fd, [want], offset)
            except OSError:
                n = -1
            if pending is not None:
                last, header = pending
                pending = None
                if n < 0:  # its stamp could not be read: unknown, not torn
                    skipped.append(last)
                elif n >= STAMP_BYTES and stamp_commits(page[:STAMP_BYTES], header):
                    found.append((header.written_ns, OffloadKey(header.key), last))
                else:  # header written, payload maybe not: never committed
                    self._stats["torn_records"] += 1
                    self._zero_quietly(last)
                    free.append(last)
            if arena_slot == slots:
                break
            if n < 0:
                skipped.append(arena_slot)
                continue
            if n == HEADER_BYTES and is_empty(page):
                free.append(arena_slot)
                continue
            try:
                checked = self._check_slot(page, n, offset, size)
            except OSError:  # the payload could not be read (verify_on_scan)
                skipped.append(arena_slot)
                continue
            if checked is None:
                self._stats["torn_records"] += 1
                self._zero_quietly(arena_slot)
                free.append(arena_slot)
                continue
            pending = (arena_slot, checked)
        # the file holds its slots and the last one's stamp; cut a partial slot, or the
        # slots past a budget that shrank, off the file
        target = slots * record_bytes + STAMP_BYTES if slots else 0
        if size != target:
            if whole > max_slots:
                self._stats["evictions"] += whole - max_slots
            with contextlib.suppress(OSError):
                files.truncate(fd, target)
        found.sort()
        seen: set[OffloadKey] = set()
        with self._lock:
            for written_ns, key, arena_slot in found:
                if key in seen:  # a duplicate from a crash between two writes: keep the newest
                    old = self._index.remove_ready(key)
                    if old is not None:
                        self._zero_quietly(old.slot)
                        free.append(old.slot)
                seen.add(key)
                self._index.add_ready(key, arena_slot, self.record_bytes, written_ns)
            self._index.set_high_water(slots, free)
            for _ in skipped:
                self._index.retire_slot(self.record_bytes)
            self._stats["unreadable_slots"] = float(len(skipped))
            self._stats["scanned_records"] = float(len(found))
            self._load_policy_state()
            over = self._index.make_room(0, self._effective_limit(), ())
            self._stats["evictions"] += len(over or ())
            self._stats["scan_seconds"] = time.perf_counter() - t0
        if skipped:
            logger.warning(
                "disk tier %s: %d arena slots could not be read at start-up (first: %s); "
                "skipped for this run, neither erased nor reused",
                self.directory,
                len(skipped),
                sorted(skipped)[:8],
            )

    def _check_slot(
        self, header_buf: memoryview, n: int, offset: int, size: int
    ) -> RecordHeader | None:
        """The record's header if it (and its payload, if asked) is right; stamp not checked.

        Raises ``OSError`` when the payload cannot be read (the caller skips the slot)."""
        if n != HEADER_BYTES or offset + self.record_bytes > size:
            return None
        try:
            header = decode_header(header_buf)
        except RecordError:
            return None
        if header.namespace != self.namespace or header.payload_len != self.memory.slot_bytes:
            return None
        if self.verify_on_scan:
            fn = checksum_function(header.checksum_kind)
            payload = bytearray(header.payload_len)
            # an OSError goes to the caller: an unreadable payload is not a bad one
            got = read_full(self.files, self._fd, [memoryview(payload)], offset + HEADER_BYTES)
            if (
                fn is None
                or got != header.payload_len
                or fn(memoryview(payload)) != header.payload_checksum
            ):
                return None
        return header

    def _zero_quietly(self, arena_slot: int) -> None:
        """Zero a slot's header fields (not the page's first bytes: the previous stamp)."""
        offset = arena_slot * self.record_bytes + STAMP_BYTES
        with contextlib.suppress(OSError):
            write_all(self.files, self._fd, (_ZERO_FIELDS,), offset)


__all__ = ["DURABILITIES", "DiskTier", "DiskTierInUseError", "namespace_digest"]
