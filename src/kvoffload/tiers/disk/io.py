"""The disk tier's file layer: every system call it makes, in one class tests can replace.

Why a class: fault injection (ENOSPC, EIO, short reads, a flipped byte) needs a seam that is
not a monkeypatch of ``os``. Reads and writes are positional (``os.preadv`` / ``os.pwritev``)
and take buffer lists, so a record's header and the host slot's ``memoryview`` go to or come
from the arena file in one call with no intermediate copy of the payload.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

_OPEN_ARENA = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


class FileLayer:
    """Thin wrappers over ``os``; subclass and override a method to inject a fault."""

    def open_arena(self, path: str) -> int:
        """Open (creating if needed) the namespace's arena file for reads and writes."""
        return os.open(path, _OPEN_ARENA, 0o644)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def preadv(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return os.preadv(fd, buffers, offset)

    def fdatasync(self, fd: int) -> None:
        """A write barrier: what was written before is on stable storage after."""
        getattr(os, "fdatasync", os.fsync)(fd)

    def fsync_dir(self, path: str) -> None:
        """Make the arena file's directory entry durable (once, when it is created)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def free_bytes(self, path: str) -> int:
        """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize


def write_all(
    files: FileLayer,
    fd: int,
    buffers: Sequence[memoryview],
    offset: int = 0,
    total: int | None = None,
) -> int:
    """Write every byte of ``buffers`` at ``offset``, resuming after short writes.

    ``total`` (the buffers' byte count, when the caller knows it) saves recounting; the
    common case is one call that writes everything, with no per-buffer work after it.
    """
    if total is None:
        total = sum(b.nbytes for b in buffers)
    n = files.pwritev(fd, buffers, offset)
    if n == total:
        return total
    if n <= 0:
        raise OSError(errno.EIO, "write made no progress")
    done = 0
    pending = [b.cast("B") if b.format != "B" else b for b in buffers]
    while True:
        done += n
        while pending and n >= pending[0].nbytes:
            n -= pending[0].nbytes
            pending.pop(0)
        if pending and n:
            pending[0] = pending[0][n:]
        if not pending:
            return total
        n = files.pwritev(fd, pending, offset + done)
        if n <= 0:
            raise OSError(errno.EIO, "write made no progress")


def read_full(files: FileLayer, fd: int, buffers: Sequence[memoryview], offset: int = 0) -> int:
    """Fill ``buffers`` from ``offset``; returns the bytes read (less only at end of file)."""
    done = 0
    pending = [b.cast("B") if b.format != "B" else b for b in buffers]
    while pending:
        n = files.preadv(fd, pending, offset + done)
        if n <= 0:
            break
        done += n
        while pending and n >= pending[0].nbytes:
            n -= pending[0].nbytes
            pending.pop(0)
        if pending and n:
            pending[0] = pending[0][n:]
    return done


__all__ = ["FileLayer", "read_full", "write_all"]
