"""The self-describing record stored under one Redis key: header, then the block's bytes.

Why one value per block (not LMCache's metadata key + data key): a ``SET`` is atomic, so a
reader sees the whole record or nothing, and no second key can be half-written, expire apart
or be overwritten by another writer (LMCache #1239, #2017). The header names the namespace and
the key, so a record copied under another key, or written for another model, fails the check.

Layout (little-endian)::

    magic "KVOR" | version u8 | flags u8 | digest algorithm u8 | reserved u8
    namespace length u16 | key length u16 | payload length u64
    namespace bytes | key bytes | digest (32 bytes) | payload

The digest covers everything before it and the payload. Algorithms: keyed BLAKE2b-256 when
the tier has a shared secret (a writer without it cannot produce a record others accept),
unkeyed BLAKE2b-256 otherwise, or XXH3-128 (``xxhash``; much faster, integrity only, never
accepted by a tier that has a secret). Records are only parsed and copied: never unpickled or
evaluated.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"KVOR"
FORMAT_VERSION = 1
FLAG_SIGNED = 0x01

ALG_BLAKE2B = 1
ALG_XXH3_128 = 2
ALG_NAMES = {"blake2b": ALG_BLAKE2B, "xxh3": ALG_XXH3_128}

DIGEST_BYTES = 32
_FIXED = struct.Struct("<4sBBBBHHQ")

try:  # optional: XXH3 is an order of magnitude faster than BLAKE2b for integrity-only records
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - exercised only where xxhash is absent
    _xxhash = None  # type: ignore[assignment]


class RecordError(ValueError):
    """A record that must not be served; ``reason`` is the counter it goes to.

    ``garbage`` says no reader could ever accept it under the name it was read from: it is
    damaged (bad magic, torn, an unkeyed digest that does not match) or names another
    namespace or key (a name is made of the namespace and the key, one-to-one). Only garbage
    may be deleted; a record signed with another secret, of another format version or digest,
    or of another payload size is some other reader's, left alone.
    """

    def __init__(self, reason: str, detail: str, *, garbage: bool = False) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.garbage = garbage


@dataclass(frozen=True)
class RecordCodec:
    """Encodes and checks records of one namespace, with one algorithm and optional secret.

    Args:
        namespace: bytes naming the model / dtype / layout (``namespace_fingerprint``).
        secret: shared secret; when set, records are signed with keyed BLAKE2b and only
            records signed with the same secret are accepted.
        algorithm: ``"blake2b"`` or ``"xxh3"`` (ignored when ``secret`` is set).
    """

    namespace: bytes
    secret: bytes | None = field(default=None, repr=False)  # never in a log line
    algorithm: str = "blake2b"

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, bytes):
            raise TypeError(f"namespace must be bytes, got {type(self.namespace).__name__}")
        if len(self.namespace) > 0xFFFF:
            raise ValueError(f"namespace must be at most 65535 bytes, got {len(self.namespace)}")
        if self.secret is not None:
            if not isinstance(self.secret, bytes):
                raise TypeError(f"secret must be bytes, got {type(self.secret).__name__}")
            if not 16 <= len(self.secret) <= 64:
                raise ValueError(
                    f"secret must be 16 to 64 bytes (BLAKE2b key), got {len(self.secret)}"
                )
        if self.algorithm not in ALG_NAMES:
            raise ValueError(
                f"algorithm must be one of {sorted(ALG_NAMES)}, got {self.algorithm!r}"
            )
        if self.algorithm == "xxh3" and self.secret is None and _xxhash is None:
            raise ValueError("algorithm='xxh3' needs the xxhash package (pip install xxhash)")

    def header_bytes(self, key: bytes) -> int:
        """Bytes before the payload for ``key``."""
        return _FIXED.size + len(self.namespace) + len(key) + DIGEST_BYTES

    def _hasher(self, alg: int, signed: bool) -> Any:
        if alg == ALG_BLAKE2B:
            if signed:
                return hashlib.blake2b(key=self.secret or b"", digest_size=DIGEST_BYTES)
            return hashlib.blake2b(digest_size=DIGEST_BYTES)
        if _xxhash is None:
            raise RecordError("unsupported", "an XXH3 record needs the xxhash package")
        return _xxhash.xxh3_128()

    def encode(self, key: bytes, payload: memoryview | bytes) -> bytes:
        """The record for ``key`` holding ``payload`` (one copy of the payload)."""
        out = bytearray(self.header_bytes(key) + len(payload))
        return bytes(self.encode_into(out, key, payload))

    def header(self, key: bytes, payload: memoryview | bytes) -> bytes:
        """The record's bytes before its payload: the record of ``payload`` is
        ``header + payload``.

        Why: a writer can send the payload from where it lies (a host slot) right after this
        header instead of copying it into a record buffer first; the digest covers both.
        """
        signed = self.secret is not None
        alg = ALG_BLAKE2B if signed else ALG_NAMES[self.algorithm]
        fixed = _FIXED.pack(
            MAGIC,
            FORMAT_VERSION,
            FLAG_SIGNED if signed else 0,
            alg,
            0,
            len(self.namespace),
            len(key),
            len(payload),
        )
        hasher = self._hasher(alg, signed)
        hasher.update(fixed)
        hasher.update(self.namespace)
        hasher.update(key)
        hasher.update(payload)
        return b"".join((fixed, self.namespace, key, hasher.digest().ljust(DIGEST_BYTES, b"\0")))

    def encode_into(self, out: bytearray, key: bytes, payload: memoryview | bytes) -> memoryview:
        """Write the record into ``out`` (reused across calls: no allocation per record).

        Returns the view of ``out`` that holds the record; ``out`` must stay untouched until
        the view has been sent.
        """
        head = self.header(key, payload)
        total = len(head) + len(payload)
        if len(out) < total:
            out.extend(bytes(total - len(out)))
        view = memoryview(out)[:total]
        view[: len(head)] = head
        view[len(head) :] = payload
        return view

    def check_header(self, key: bytes, record: bytes | memoryview) -> tuple[int, int, int, int]:
        """Check what precedes the digest (``record`` may be only its first bytes): magic,
        version, namespace, key. Returns ``(flags, algorithm, payload length, digest offset)``;
        raises :class:`RecordError` (``corrupt`` or ``foreign``) otherwise."""
        view = memoryview(record)
        if len(view) < _FIXED.size:
            raise RecordError(
                "corrupt", f"record of {len(view)} bytes is shorter than a header", garbage=True
            )
        magic, version, flags, alg, _reserved, ns_len, key_len, payload_len = _FIXED.unpack_from(
            view
        )
        if magic != MAGIC:
            raise RecordError("corrupt", "bad magic", garbage=True)
        if version != FORMAT_VERSION:
            raise RecordError("foreign", f"format version {version}, expected {FORMAT_VERSION}")
        start = _FIXED.size
        digest_at = start + ns_len + key_len
        if ns_len != len(self.namespace) or view[start : start + ns_len] != self.namespace:
            raise RecordError("foreign", "record of another namespace", garbage=True)
        if key_len != len(key) or view[start + ns_len : digest_at] != key:
            raise RecordError("foreign", "record of another key", garbage=True)
        return flags, alg, payload_len, digest_at

    def payload_of(self, key: bytes, record: bytes | memoryview) -> memoryview:
        """The verified payload of ``record`` stored under ``key`` (a view, no copy).

        Raises :class:`RecordError` with ``reason`` ``"corrupt"`` (bad magic, lengths or
        digest), ``"foreign"`` (another namespace or key, or an unknown version) or
        ``"bad_signature"`` (unsigned or signed with another secret, where a secret is set).
        """
        view = memoryview(record)
        flags, alg, payload_len, digest_at = self.check_header(key, view)
        payload_at = digest_at + DIGEST_BYTES
        if payload_at + payload_len != len(view):
            raise RecordError(
                "corrupt",
                f"lengths say {payload_at + payload_len} bytes, record has {len(view)}",
                garbage=True,
            )
        signed = bool(flags & FLAG_SIGNED)
        if self.secret is not None and (not signed or alg != ALG_BLAKE2B):
            raise RecordError("bad_signature", "record is not signed with keyed BLAKE2b")
        if self.secret is None and signed:
            raise RecordError("bad_signature", "record is signed and this tier has no secret")
        if alg not in (ALG_BLAKE2B, ALG_XXH3_128):
            raise RecordError("foreign", f"unknown digest algorithm {alg}")
        hasher = self._hasher(alg, signed)
        hasher.update(view[:digest_at])
        payload = view[payload_at:]
        hasher.update(payload)
        expected = hasher.digest().ljust(DIGEST_BYTES, b"\0")
        if not hmac.compare_digest(expected, view[digest_at:payload_at]):
            if signed:  # another secret's signature, or damage: nobody can tell which
                raise RecordError("bad_signature", "digest mismatch")
            raise RecordError("corrupt", "digest mismatch", garbage=True)
        return payload
