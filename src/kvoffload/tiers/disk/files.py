"""The disk tier's files beside its arena: the one-writer lock and the saved policy state.

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
import os
from dataclasses import dataclass

from kvoffload.policies import CachePolicy
from kvoffload.policies.state import export_policy_state, restore_policy_state
from kvoffload.tiers.disk.index import DiskIndex
from kvoffload.tiers.disk.io import FileLayer
from kvoffload.tiers.disk.records import FORMAT_VERSION, NAMESPACE_BYTES


class DiskTierInUseError(ValueError):
    """Another tier (this process or another) holds the arena this one would open."""


def lock_arena(path: str) -> int:
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


@dataclass(frozen=True)
class ArenaPaths:
    """The files of one namespace and block size under the tier's directory."""

    arena: str  # the slot size is in the name: a tier of another block size is another arena
    legacy: str  # a format 1 arena (no version in the name): refused, neither read nor touched
    policy_state: str  # the policy's state at the last clean close (order, frequencies, ghosts)
    lock: str  # one writer per arena: held from before the scan until close

    @classmethod
    def of(cls, directory: str, slot_bytes: int) -> ArenaPaths:
        def name(text: str) -> str:
            return os.path.join(directory, text)

        return cls(
            arena=name(f"arena-{slot_bytes}.v{FORMAT_VERSION}.kv"),
            legacy=name(f"arena-{slot_bytes}.kv"),
            policy_state=name(f"policy-{slot_bytes}.v{FORMAT_VERSION}.json"),
            lock=name(f"arena-{slot_bytes}.v{FORMAT_VERSION}.lock"),
        )


def save_policy_state(path: str, policy: CachePolicy, durability: str, files: FileLayer) -> None:
    """Write ``policy``'s state to ``path`` (temporary name, then rename) so the next start
    resumes its decisions; under ``fsync``, with the file and its directory synced. Raises
    what the export or the filesystem raises (the tier counts it, never raises at close)."""
    tmp = path + ".tmp"
    try:
        data = export_policy_state(policy)
        with open(tmp, "wb") as out:
            out.write(data)
            if durability == "fsync":
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, path)
        if durability == "fsync":
            files.fsync_dir(os.path.dirname(path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_policy_state(path: str, index: DiskIndex, stats: dict[str, float]) -> None:
    """After the scan: adopt the state saved at the last clean close into ``index``, if it is
    this policy's at this capacity (else the scan's oldest-first seeding stays). The file is
    consumed, so a later crash restarts from the scan, never from a stale order. Counts the
    outcome in ``stats``: ``policy_state_restored`` (1), ``policy_state_ignored`` (another
    policy, budget or block size, or undecodable), ``policy_state_errors`` (unreadable)."""
    try:
        with open(path, "rb") as saved:
            data = saved.read()
    except FileNotFoundError:
        return
    except OSError:
        stats["policy_state_errors"] += 1
        return
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    current = index.policy
    try:
        restored = restore_policy_state(data)
        if type(restored) is not type(current) or restored.cache_capacity != current.cache_capacity:
            raise ValueError("another policy, budget or block size")
        index.adopt_policy(restored)  # ValueError: a policy without a block table
    except (ValueError, TypeError, RecursionError):
        stats["policy_state_ignored"] += 1
        return
    stats["policy_state_restored"] = 1.0


__all__ = [
    "ArenaPaths",
    "DiskTierInUseError",
    "load_policy_state",
    "lock_arena",
    "namespace_digest",
    "save_policy_state",
]
