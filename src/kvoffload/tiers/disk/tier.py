"""``DiskTier``: a bounded, crash-safe, checksummed store of host slots on a local filesystem.

What it fixes in the peers (``reference/tiering.md`` §1.5, §1.11, §2.5): a byte budget and a
free-space floor (vLLM's fs tier has neither and never deletes a file), eviction by any registry
policy with in-flight records pinned, self-describing records whose header is written only after
the payload (optionally with write barriers), a warm restart that rebuilds the index from the
file (the LMCache and SGLang restart misses) and erases torn records, a checksum verified on
every read (a bad record is a counted miss, never data), and I/O tasks on a thread pool, runs
of adjacent records each, so one large batch uses every thread (vLLM runs a job serially on
one thread).

Layout: one arena file per namespace and block size (``files.ArenaPaths``: a format 1 arena
is refused, its size reported as ``legacy_arena_bytes``), cut into slots of a 4 KiB header
page plus ``slot_bytes`` (``records`` has the format). Every record is one host slot long, so
a freed slot is reused in place and nothing needs compaction (why not an append-only log);
nor is there a file per record (creating an inode cost far more than writing a record).

A write is ordered so that a commit stamp after the payload commits the record, the guarantee
a temporary name plus rename gives a file: ``arena`` holds that order and every read and write
of the file; this module keeps the index, the budget and the jobs (on ``runtime``).

Warm decisions and one writer per arena: ``files`` (the policy state saved at a clean close,
the arena's lock).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

from kvoffload._checks import check_bool, check_int
from kvoffload.keys import OffloadKey
from kvoffload.policies import create_cache_policy
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
)
from kvoffload.tiers.disk.arena import Arena
from kvoffload.tiers.disk.files import (
    ArenaPaths,
    DiskTierInUseError,
    load_policy_state,
    lock_arena,
    namespace_digest,
    save_policy_state,
)
from kvoffload.tiers.disk.index import DiskIndex
from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import (
    HEADER_BYTES,
    MAX_KEY_BYTES,
    checksum_function,
    resolve_checksum,
)
from kvoffload.tiers.disk.tasks import (
    MAX_PUT_TASK_BYTES,
    MIN_GET_TASK_BYTES,
    MIN_PUT_TASK_BYTES,
    RunItem,
    chunk_runs,
    put_lane_width,
)
from kvoffload.tiers.runtime import (
    CANCELLED,
    CLOSED,
    FailureLog,
    Job,
    Lane,
    TierRuntime,
    check_batch,
)

logger = logging.getLogger(__name__)

DURABILITIES = ("none", "rename", "fsync")
_FREE_SPACE_REFRESH_S = 0.25
#: Least seconds between two WARNING lines about failed stores (the counts add up between).
DROP_WARNING_INTERVAL_S = 60.0
#: Drop reasons that are the caller's or the job's own business, never worth a warning.
_QUIET_DROPS = frozenset({"in_flight", "duplicate", CANCELLED, CLOSED})


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
        io_threads: I/O threads; a job's records go to them as runs of adjacent arena slots
            (one vectored system call each), cut so a large job uses every thread.
        put_lanes: how many put tasks may run at once (at most ``io_threads``); ``None``
            (the default): two, one for records under 128 KiB, every thread under ``fsync``
            (``tasks.put_lane_width``).
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
        put_lanes: int | None = None,
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
        if put_lanes is None:
            put_lanes = put_lane_width(durability, memory.slot_bytes, io_threads)
        put_lanes = check_int("put_lanes", put_lanes, 1, io_threads, " (at most io_threads)")
        self.durability = durability
        self._checksum_kind = resolve_checksum(checksum)
        fn = checksum_function(self._checksum_kind)
        if fn is None:  # resolve_checksum only returns kinds available here
            raise ValueError(f"checksum {checksum!r} is not available in this environment")
        self.verify_on_scan = check_bool("verify_on_scan", verify_on_scan)
        self.save_policy_state = check_bool("save_policy_state", save_policy_state)
        self.files = files if files is not None else FileLayer()
        self.namespace = namespace_digest(namespace)
        self.root = os.fspath(path)
        self.directory = os.path.join(self.root, self.namespace.hex()[:32])
        paths = ArenaPaths.of(self.directory, memory.slot_bytes)
        self.arena_path, self.legacy_arena_path = paths.arena, paths.legacy
        self.policy_state_path, self.lock_path = paths.policy_state, paths.lock
        max_slots = self.capacity_bytes // self.record_bytes
        policy_obj = create_cache_policy(
            policy, max_slots, module_path=policy_module_path, params=dict(policy_params or {})
        )
        self._index = DiskIndex(policy_obj, max_slots)
        self._runtime = TierRuntime(io_threads, "kvoff-disk")
        self._put_lane = Lane(put_lanes)
        self._lock = self._runtime.lock
        self._limit = self.capacity_bytes
        self._limit_at = -1.0
        # the common figures start at zero in TierStats; the arena's own are listed so that
        # they are reported at zero too
        self._stats: defaultdict[str, float] = defaultdict(float)
        for name in (
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
        ):
            self._stats[name] = 0.0
        self._drops = FailureLog(_QUIET_DROPS, DROP_WARNING_INTERVAL_S)
        self._get_failures = FailureLog()  # counted, never worth a warning
        self._health = TierHealth(ok=True)
        self.files.makedirs(self.directory)
        self._lock_fd = lock_arena(self.lock_path)
        fd = None
        try:
            created = not os.path.exists(self.arena_path)
            with contextlib.suppress(OSError):
                self._stats["legacy_arena_bytes"] = float(os.path.getsize(self.legacy_arena_path))
            fd = self._fd = self.files.open_arena(self.arena_path)
            if created and durability == "fsync":
                self.files.fsync_dir(self.directory)
            self._arena = Arena(
                memory, self.files, fd, self.namespace, self._checksum_kind, fn, durability
            )
            self._recover()
        except BaseException:
            self._runtime.close(0)
            if fd is not None:
                with contextlib.suppress(OSError):
                    self.files.close(fd)
            os.close(self._lock_fd)  # closing the fd drops the lock
            raise

    # ----------------------------------------------------------------- the contract

    @property
    def capabilities(self) -> TierCapabilities:
        return TierCapabilities(max_value_bytes=self.memory.slot_bytes)

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        if self._runtime.closed:  # nothing is served after close
            return [Presence.MISS] * len(keys)
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
            self._stats["lookup_hits"] += hits
            return out

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys_t, slots_t = check_batch(keys, slots, self.memory.num_slots)
        runtime = self._runtime
        with self._lock:
            job = runtime.open_job(JobKind.PUT, keys_t, generation)
            self._stats["puts"] += len(keys_t)
            if runtime.closed:
                return runtime.finish(job)
            written: list[int] = []  # indices of keys written, published when the job ends
            job.on_finish = lambda done: self._publish(done, written)
            batch = set(keys_t)
            # a set of keys seen so far is only needed when the batch repeats one
            seen: set[OffloadKey] | None = set() if len(batch) != len(keys_t) else None
            index, record_bytes = self._index, self.record_bytes
            new: list[tuple[int, OffloadKey, int]] = []  # (index in job, key, host slot)
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
                new.append((i, key, slot))
            # the keys that fit under the limit as it stands take their slots in one go; each
            # later key first makes room (in order, as if one at a time: the policy sees the
            # same inserts before each eviction)
            limit = self._effective_limit()
            taken = index.used_bytes + index.reserved_bytes + index.retired_bytes
            fitting = new[: max(0, (limit - taken) // record_bytes)]
            entries = index.begin_writes([key for _, key, _ in fitting], record_bytes)
            tasks = [
                RunItem(i, key, slot, entry)
                for (i, key, slot), entry in zip(fitting, entries, strict=False)
            ]
            evictions = 0
            for i, key, slot in new[len(entries) :]:
                entry = None
                if len(entries) == len(fitting):  # else the slots ran out: nothing fits
                    victims = index.make_room(record_bytes, limit, batch)
                    entry = None if victims is None else index.begin_write(key, record_bytes)
                    if victims:
                        job.evicted.extend(victim_key for victim_key, _ in victims)
                        evictions += len(victims)
                if entry is None:
                    self._drop(job, i, "no_space")
                    continue
                tasks.append(RunItem(i, key, slot, entry))
            self._stats["evictions"] += evictions
            for chunk in chunk_runs(
                tasks, self._threads, MIN_PUT_TASK_BYTES, self.record_bytes, MAX_PUT_TASK_BYTES
            ):
                runtime.spawn(job, self._run_put, job, chunk, written, lane=self._put_lane)
            return runtime.finish(job)

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        keys_t, slots_t = check_batch(keys, slots, self.memory.num_slots)
        runtime = self._runtime
        with self._lock:
            job = runtime.open_job(JobKind.GET, keys_t, generation)
            self._stats["gets"] += len(keys_t)
            if runtime.closed:
                return runtime.finish(job)
            tasks: list[RunItem] = []
            hit_keys = []
            for i, (key, slot) in enumerate(zip(keys_t, slots_t, strict=True)):
                entry = self._index.begin_read(key)
                if entry is None:
                    self._get_failed(job, i, "missing")
                    continue
                hit_keys.append(key)
                tasks.append(RunItem(i, key, slot, entry))
            if hit_keys:
                hit_keys.reverse()  # tail first, as puts publish: a prefix head ends newest
                self._index.access(hit_keys)
            for chunk in chunk_runs(tasks, self._threads, MIN_GET_TASK_BYTES, self.record_bytes):
                runtime.spawn(job, self._run_get, job, chunk)
            return runtime.finish(job)

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        keys_t = tuple(keys)
        runtime = self._runtime
        with self._lock:
            job = runtime.open_job(JobKind.DELETE, keys_t, generation)
            if runtime.closed:
                return runtime.finish(job)
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
            for slot in erase:
                runtime.spawn(job, self._run_erase, job, slot)
            return runtime.finish(job)

    def poll(self) -> list[TierResult]:
        return self._runtime.poll()

    def drain(self, timeout: float) -> bool:
        return self._runtime.drain(timeout)

    def health(self) -> TierHealth:
        """Not ok when the filesystem cannot be queried or is below the free-space floor."""
        with self._lock:
            if self._health.ok and self._effective_limit() < self.record_bytes:
                return TierHealth(ok=False, reason="no slot fits above min_free_bytes")
            return self._health

    def tier_stats(self) -> TierStats:
        """The common figures, and in ``extra`` the arena's own: records found bad
        (``corrupt_records``, ``torn_records``), the restart scan, the free-space limit, and
        failed keys by reason (``dropped_<reason>`` for puts, ``get_failed_<reason>``)."""
        with self._lock:
            return TierStats.from_mapping(
                {
                    **self._stats,
                    "reserved_bytes": self._index.reserved_bytes,
                    "effective_capacity_bytes": self._limit,
                    "arena_slots": self._index.high_water,
                    **self._drops.by_reason("dropped_"),
                    **self._get_failures.by_reason("get_failed_"),
                    "failed_keys": self._drops.total + self._get_failures.total,
                    "bad_records": self._stats["corrupt_records"] + self._stats["torn_records"],
                    "used_bytes": self._index.used_bytes,
                    "capacity_bytes": self.capacity_bytes,
                    "records": len(self._index),
                    "jobs_in_flight": self._runtime.jobs_in_flight,
                }
            )

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
        if not self._runtime.close(timeout):
            return
        try:
            self.files.close(self._fd)
            self._save_policy_state()
        finally:
            os.close(self._lock_fd)  # the next opener may take the arena now

    def _save_policy_state(self) -> None:
        """Save the policy's state for the next start; a failure is counted, never raised."""
        if not self.save_policy_state or not len(self._index):
            return
        try:  # an out-of-tree policy may not export; the disk, not be writable
            with self._lock:
                policy = self._index.policy
                save_policy_state(self.policy_state_path, policy, self.durability, self.files)
        except Exception:
            self._stats["policy_state_errors"] += 1

    # ----------------------------------------------------------------- helpers

    def _drop(self, job: Job, i: int, reason: str) -> None:
        job.reasons[i] = reason
        counts = self._drops.add(reason)
        if counts is not None:
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

    def _get_failed(self, job: Job, i: int, reason: str) -> None:
        job.reasons[i] = reason
        self._get_failures.add(reason)

    def _publish(self, job: Job, written: list[int]) -> None:
        """A put job's records enter the policy together, tail first (lock held)."""
        if written:
            self._index.publish([job.keys[i] for i in sorted(written, reverse=True)])

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

    # ----------------------------------------------------------------- I/O tasks (threads)

    def _run_put(self, job: Job, items: list[RunItem], written: list[int]) -> None:
        reason: str | None = CANCELLED
        t0 = time.perf_counter()
        written_ns = 0
        if not self._runtime.closed:
            try:
                written_ns = self._arena.write_run(items)
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
                written.extend(item.index for item in items)
                nbytes = len(items) * self.memory.slot_bytes
                job.nbytes += nbytes
                self._stats["stored"] += len(items)
                self._stats["bytes_written"] += nbytes
            else:
                for item in items:
                    end_write(item.key, False)
                    self._drop(job, item.index, reason)
            self._stats["write_seconds"] += seconds
            self._runtime.finish(job, 1)

    def _run_get(self, job: Job, items: list[RunItem]) -> None:
        reasons: list[str | None] = [CANCELLED] * len(items)
        t0 = time.perf_counter()
        if not self._runtime.closed:
            try:
                reasons = self._arena.read_run(items)
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
                    self._stats["hits"] += 1
                    self._stats["bytes_read"] += self.memory.slot_bytes
                else:
                    if bad:
                        self._stats["corrupt_records"] += 1
                    self._get_failed(job, item.index, reason)
                if doomed is not None:
                    self._runtime.spawn(job, self._run_erase, job, doomed.slot)
            self._stats["read_seconds"] += seconds
            self._runtime.finish(job, 1)

    def _run_erase(self, job: Job, arena_slot: int) -> None:
        """Zero a deleted or corrupt record's header, then free its slot."""
        failed = False
        try:
            self._arena.erase(arena_slot)
        except Exception:
            failed = True  # the slot stays out of use: its old header might still be valid
        with self._lock:
            if failed:
                self._stats["erase_errors"] += 1
                self._index.retire_slot(self.record_bytes)
            else:
                self._index.release_slot(arena_slot)
            self._runtime.finish(job, 1)

    # ----------------------------------------------------------------- warm restart

    def _recover(self) -> None:
        """Rebuild the index from the arena's records, oldest first (seeds the policy).

        The arena's scan reads the headers and stamps (``Arena.scan``); here the records it
        found enter the index, slots past the budget count as evicted, unreadable slots are
        retired for this run, and records over the effective limit are evicted by the policy.
        """
        t0 = time.perf_counter()
        report = self._arena.scan(self._index.max_slots, self.verify_on_scan)
        self._stats["torn_records"] += report.torn
        self._stats["evictions"] += report.cut_slots
        skipped = report.skipped
        with self._lock:
            stale = self._index.rebuild(
                report.found, report.slots, report.free, skipped, self.record_bytes
            )
            for arena_slot in stale:  # a duplicate from a crash between two writes
                self._arena.zero_quietly(arena_slot)
            self._stats["unreadable_slots"] = float(len(skipped))
            self._stats["scanned_records"] = float(len(report.found))
            load_policy_state(self.policy_state_path, self._index, self._stats)
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


__all__ = ["DURABILITIES", "DiskTier", "DiskTierInUseError", "namespace_digest"]
