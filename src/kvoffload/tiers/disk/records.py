"""The on-disk record: a self-describing header, padded to 4 KiB, then the raw slot bytes.

Why a header at all (``reference/tiering.md`` §1.11, §7.3): vLLM's fs tier stores raw bytes
and checks only a file's length, so a torn or garbled file of the right size is served. Every
record here names its format, its namespace and its key, and carries a checksum of the payload
that every read verifies; the header has its own CRC so a flipped header byte is caught before
its fields are trusted. The header is padded to :data:`HEADER_BYTES` so the payload starts on a
page boundary (ready for ``O_DIRECT`` and for page-cache-friendly reads).

Layout (little-endian)::

    magic 8s | version u16 | header_bytes u16 | checksum_kind u8 | flags u8 | key_len u16
    | payload_len u64 | payload_checksum u64 | written_ns u64 | namespace 32s | header_crc u32
    | key | zero pad

An all-zero header (no magic) is an empty slot of the arena file.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

_xxhash: ModuleType | None
try:  # optional: ~10x faster than crc32 on large payloads
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None

MAGIC = b"KVOFFBLK"
FORMAT_VERSION = 1
HEADER_BYTES = 4096
NAMESPACE_BYTES = 32

_FIXED = struct.Struct("<8sHHBBHQQQ32s")
_CRC = struct.Struct("<I")
_KEY_OFFSET = _FIXED.size + _CRC.size
MAX_KEY_BYTES = HEADER_BYTES - _KEY_OFFSET


class ChecksumKind(enum.IntEnum):
    """The payload checksum a record carries (its id is stored in the header)."""

    CRC32 = 1
    XXH3_64 = 2


def xxhash_available() -> bool:
    """True when the ``xxhash`` package is importable (then ``auto`` picks xxh3)."""
    return _xxhash is not None


def resolve_checksum(name: str) -> ChecksumKind:
    """``"auto"`` (xxh3 when installed, else crc32), ``"xxh3"`` or ``"crc32"``."""
    if not isinstance(name, str):
        raise TypeError(f"checksum must be a str, got {type(name).__name__}")
    if name == "auto":
        return ChecksumKind.XXH3_64 if _xxhash is not None else ChecksumKind.CRC32
    if name == "crc32":
        return ChecksumKind.CRC32
    if name == "xxh3":
        if _xxhash is None:
            raise ValueError("checksum 'xxh3' needs the xxhash package; use 'auto' or 'crc32'")
        return ChecksumKind.XXH3_64
    raise ValueError(f"checksum must be 'auto', 'xxh3' or 'crc32', got {name!r}")


def checksum_function(kind: ChecksumKind) -> Callable[[memoryview], int] | None:
    """The function computing ``kind`` over a buffer, or ``None`` if it is unavailable here."""
    if kind is ChecksumKind.CRC32:
        return zlib.crc32
    if kind is ChecksumKind.XXH3_64 and _xxhash is not None:
        fn: Callable[[memoryview], int] = _xxhash.xxh3_64_intdigest
        return fn
    return None


class RecordError(ValueError):
    """A header that is not one of ours, of another namespace or version, or damaged."""


@dataclass(frozen=True)
class RecordHeader:
    """The decoded fields of a record's header."""

    key: bytes
    namespace: bytes
    payload_len: int
    checksum_kind: ChecksumKind
    payload_checksum: int
    written_ns: int = 0
    header_bytes: int = HEADER_BYTES
    version: int = FORMAT_VERSION

    @property
    def record_bytes(self) -> int:
        """The file's full size: header plus payload."""
        return self.header_bytes + self.payload_len


def encode_header(
    key: bytes,
    namespace: bytes,
    payload_len: int,
    checksum_kind: ChecksumKind,
    payload_checksum: int,
    written_ns: int = 0,
) -> bytes:
    """The :data:`HEADER_BYTES` header of a record (padded with zeros)."""
    buf = bytearray(HEADER_BYTES)
    encode_header_into(
        buf, 0, key, namespace, payload_len, checksum_kind, payload_checksum, written_ns
    )
    return bytes(buf)


def encode_header_into(
    buf: bytearray,
    offset: int,
    key: bytes,
    namespace: bytes,
    payload_len: int,
    checksum_kind: ChecksumKind,
    payload_checksum: int,
    written_ns: int = 0,
) -> None:
    """Write a header into ``buf[offset : offset + HEADER_BYTES]``, which must be zeros.

    Why: a store of a run of records packs all their headers into one buffer with no
    per-record ``bytes`` allocation (the pad stays the buffer's own zeros).
    """
    if len(namespace) != NAMESPACE_BYTES:
        raise ValueError(f"namespace must be {NAMESPACE_BYTES} bytes, got {len(namespace)}")
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
    if offset < 0 or offset + HEADER_BYTES > len(buf):
        raise ValueError(f"no room for a header at offset {offset} of {len(buf)} bytes")
    _FIXED.pack_into(
        buf,
        offset,
        MAGIC,
        FORMAT_VERSION,
        HEADER_BYTES,
        int(checksum_kind),
        0,
        len(key),
        payload_len,
        payload_checksum,
        written_ns,
        namespace,
    )
    view = memoryview(buf)
    crc = zlib.crc32(key, zlib.crc32(view[offset : offset + _FIXED.size]))
    _CRC.pack_into(buf, offset + _FIXED.size, crc)
    start = offset + _KEY_OFFSET
    buf[start : start + len(key)] = key


def is_empty(buf: bytes | bytearray | memoryview) -> bool:
    """True for a slot that holds no record (its magic bytes are zero)."""
    return bytes(memoryview(buf)[: len(MAGIC)]) == bytes(len(MAGIC))


def decode_header(buf: bytes | bytearray | memoryview) -> RecordHeader:
    """Parse and check a header; :class:`RecordError` says what is wrong with it."""
    view = memoryview(buf)
    if len(view) < _KEY_OFFSET:
        raise RecordError(f"header truncated: {len(view)} bytes")
    (
        magic,
        version,
        header_bytes,
        kind,
        _flags,
        key_len,
        payload_len,
        checksum,
        written_ns,
        namespace,
    ) = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise RecordError("bad magic: not a kvoffload record")
    if version != FORMAT_VERSION:
        raise RecordError(f"format version {version}, this build reads {FORMAT_VERSION}")
    if header_bytes != HEADER_BYTES or key_len == 0 or key_len > MAX_KEY_BYTES:
        raise RecordError("header fields out of range")
    if len(view) < _KEY_OFFSET + key_len:
        raise RecordError("header truncated before the key")
    key = bytes(view[_KEY_OFFSET : _KEY_OFFSET + key_len])
    (crc,) = _CRC.unpack_from(view, _FIXED.size)
    if zlib.crc32(key, zlib.crc32(view[: _FIXED.size])) != crc:
        raise RecordError("header checksum mismatch")
    try:
        checksum_kind = ChecksumKind(kind)
    except ValueError:
        raise RecordError(f"unknown checksum kind {kind}") from None
    return RecordHeader(
        key=key,
        namespace=bytes(namespace),
        payload_len=payload_len,
        checksum_kind=checksum_kind,
        payload_checksum=checksum,
        written_ns=written_ns,
    )


__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_KEY_BYTES",
    "NAMESPACE_BYTES",
    "ChecksumKind",
    "RecordError",
    "RecordHeader",
    "checksum_function",
    "decode_header",
    "encode_header",
    "encode_header_into",
    "is_empty",
    "resolve_checksum",
    "xxhash_available",
]
