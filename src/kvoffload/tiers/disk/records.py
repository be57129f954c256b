"""The on-disk record: a header page, the raw slot bytes, then a commit stamp.

Why a header at all (``reference/tiering.md`` §1.11, §7.3): vLLM's fs tier stores raw bytes
and checks only a file's length, so a torn or garbled file of the right size is served. Every
record here names its format, its namespace and its key, and carries a checksum of the payload
that every read verifies; the header has its own CRC so a flipped header byte is caught before
its fields are trusted. The header page is :data:`HEADER_BYTES` long so the payload starts on a
page boundary (ready for ``O_DIRECT`` and for page-cache-friendly reads).

Why a commit stamp (format 2): a record counts only once a :data:`STAMP_BYTES` stamp naming
its header (the header's CRC and a per-write id) follows its payload. In file order a record is
header, payload, stamp, so one sequential write of a run of adjacent records kills each old
record (its header changes) before its payload changes and commits each new one after its
payload is complete, with no second write per header (format 1 needed one). The stamp of the
record in arena slot ``k`` is the first :data:`STAMP_BYTES` of slot ``k + 1``'s header page
(the header itself starts after them), or the arena's tail for the last slot.

Header page layout (little-endian)::

    [0, STAMP_BYTES): the previous slot's stamp
    magic 8s | version u16 | header_bytes u16 | checksum_kind u8 | flags u8 | key_len u16
    | payload_len u64 | payload_checksum u64 | written_ns u64 | namespace 32s | write_id u64
    | header_crc u32 | key | zero pad

Stamp layout: ``stamp_magic 8s | version u16 | reserved u16 | header_crc u32 | write_id u64
| stamp_crc u32 | zero pad``. A header page with no magic is an empty slot of the arena file.
Format 1 headers (magic at the page's first byte, no stamp) are refused with their version.
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
STAMP_MAGIC = b"KVOFFCMT"
FORMAT_VERSION = 2
HEADER_BYTES = 4096
STAMP_BYTES = 64
NAMESPACE_BYTES = 32

_FIXED = struct.Struct("<8sHHBBHQQQ32sQ")
_CRC = struct.Struct("<I")
_STAMP = struct.Struct("<8sHHIQ")
_V1 = struct.Struct("<8sH")  # format 1: magic and version at the page's first byte
_FIELDS = STAMP_BYTES  # the header's fields start after the previous slot's stamp
_KEY_OFFSET = _FIELDS + _FIXED.size + _CRC.size
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
    write_id: int = 0
    header_crc: int = 0
    header_bytes: int = HEADER_BYTES
    version: int = FORMAT_VERSION


def encode_header(
    key: bytes,
    namespace: bytes,
    payload_len: int,
    checksum_kind: ChecksumKind,
    payload_checksum: int,
    written_ns: int = 0,
    write_id: int = 0,
) -> bytes:
    """The :data:`HEADER_BYTES` header page of a record (stamp area and padding zero)."""
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
    fields, _crc = HeaderPacker(namespace, checksum_kind).fields(
        key, payload_len, payload_checksum, written_ns, write_id
    )
    return bytes(_FIELDS) + fields + bytes(HEADER_BYTES - _FIELDS - len(fields))


def stamp_bytes(header_crc: int, write_id: int) -> bytes:
    """The commit stamp of the record whose header has ``header_crc`` and ``write_id``, with
    its own CRC (the rest of the :data:`STAMP_BYTES` area stays zero)."""
    stamp = _STAMP.pack(STAMP_MAGIC, FORMAT_VERSION, 0, header_crc, write_id)
    return stamp + _CRC.pack(zlib.crc32(stamp))


class HeaderPacker:
    """Packs the header fields of one arena's records: namespace and checksum kind fixed.

    Why a class: a store packs a header per record, and checking the namespace, converting
    the checksum kind and binding the module's structs once per arena, not per record, is
    most of what packing a header costs in Python. The key's length is the caller's to check
    (the tier refuses longer keys before it packs).
    """

    __slots__ = ("_kind", "_namespace")

    def __init__(self, namespace: bytes, checksum_kind: ChecksumKind) -> None:
        if len(namespace) != NAMESPACE_BYTES:
            raise ValueError(f"namespace must be {NAMESPACE_BYTES} bytes, got {len(namespace)}")
        self._namespace = bytes(namespace)
        self._kind = int(checksum_kind)

    def fields(
        self,
        key: bytes,
        payload_len: int,
        payload_checksum: int,
        written_ns: int,
        write_id: int,
    ) -> tuple[bytes, int]:
        """The bytes a header page holds after its stamp area (fields, their CRC, the key)
        and the header's CRC, which the record's stamp names."""
        fixed = _FIXED.pack(
            MAGIC,
            FORMAT_VERSION,
            HEADER_BYTES,
            self._kind,
            0,
            len(key),
            payload_len,
            payload_checksum,
            written_ns,
            self._namespace,
            write_id,
        )
        crc = zlib.crc32(key, zlib.crc32(fixed))
        return fixed + _CRC.pack(crc) + key, crc


def stamp_commits(stamp: bytes | bytearray | memoryview, header: RecordHeader) -> bool:
    """True when ``stamp`` is an intact commit stamp of exactly ``header``'s write."""
    view = memoryview(stamp)
    if len(view) < _STAMP.size + _CRC.size:
        return False
    magic, version, _reserved, header_crc, write_id = _STAMP.unpack_from(view)
    (crc,) = _CRC.unpack_from(view, _STAMP.size)
    return bool(
        magic == STAMP_MAGIC
        and version == FORMAT_VERSION
        and crc == zlib.crc32(view[: _STAMP.size])
        and header_crc == header.header_crc
        and write_id == header.write_id
    )


def is_empty(buf: bytes | bytearray | memoryview) -> bool:
    """True for a header page that holds no record (its magic bytes are zero)."""
    return bytes(memoryview(buf)[_FIELDS : _FIELDS + len(MAGIC)]) == bytes(len(MAGIC))


def decode_header(buf: bytes | bytearray | memoryview) -> RecordHeader:
    """Parse and check a header page; :class:`RecordError` says what is wrong with it."""
    view = memoryview(buf)
    if len(view) >= _V1.size and view[: len(MAGIC)] == MAGIC:
        (_magic, version) = _V1.unpack_from(view)
        raise RecordError(f"format version {version}, this build reads {FORMAT_VERSION}")
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
        write_id,
    ) = _FIXED.unpack_from(view, _FIELDS)
    if magic != MAGIC:
        raise RecordError("bad magic: not a kvoffload record")
    if version != FORMAT_VERSION:
        raise RecordError(f"format version {version}, this build reads {FORMAT_VERSION}")
    if header_bytes != HEADER_BYTES or key_len == 0 or key_len > MAX_KEY_BYTES:
        raise RecordError("header fields out of range")
    if len(view) < _KEY_OFFSET + key_len:
        raise RecordError("header truncated before the key")
    key = bytes(view[_KEY_OFFSET : _KEY_OFFSET + key_len])
    (crc,) = _CRC.unpack_from(view, _FIELDS + _FIXED.size)
    if zlib.crc32(key, zlib.crc32(view[_FIELDS : _FIELDS + _FIXED.size])) != crc:
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
        write_id=write_id,
        header_crc=crc,
    )


__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_KEY_BYTES",
    "NAMESPACE_BYTES",
    "STAMP_BYTES",
    "STAMP_MAGIC",
    "ChecksumKind",
    "HeaderPacker",
    "RecordError",
    "RecordHeader",
    "checksum_function",
    "decode_header",
    "encode_header",
    "is_empty",
    "resolve_checksum",
    "stamp_bytes",
    "stamp_commits",
    "xxhash_available",
]
