"""The record header: round trip, and every damaged or foreign header refused with a reason."""

from __future__ import annotations

import struct
import zlib

import pytest

from kvoffload.tiers.disk.records import (
    HEADER_BYTES,
    MAX_KEY_BYTES,
    STAMP_BYTES,
    ChecksumKind,
    RecordError,
    decode_header,
    encode_header,
    is_empty,
    resolve_checksum,
    stamp_bytes,
    stamp_commits,
)

NS = bytes(range(32))


def test_header_round_trips_and_is_padded_to_4_kib() -> None:
    raw = encode_header(b"k" * 36, NS, 12345, ChecksumKind.CRC32, 0xDEADBEEF, 77)
    assert len(raw) == HEADER_BYTES
    header = decode_header(raw)
    assert (header.key, header.namespace, header.payload_len) == (b"k" * 36, NS, 12345)
    assert (header.checksum_kind, header.payload_checksum, header.written_ns) == (
        ChecksumKind.CRC32,
        0xDEADBEEF,
        77,
    )
    assert not is_empty(raw) and is_empty(bytes(HEADER_BYTES))


@pytest.mark.parametrize(
    ("offset", "message"),
    [(0, "magic"), (8, "version"), (20, "checksum"), (60, "checksum"), (70, "checksum")],
)
def test_a_damaged_header_is_refused(offset: int, message: str) -> None:
    raw = bytearray(encode_header(b"key-1234", NS, 10, ChecksumKind.XXH3_64, 5))
    raw[STAMP_BYTES + offset] ^= 0x04  # the fields follow the previous slot's stamp
    with pytest.raises(RecordError, match=message):
        decode_header(raw)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="namespace"):
        encode_header(b"k", b"short", 1, ChecksumKind.CRC32, 0)
    with pytest.raises(ValueError, match="key"):
        encode_header(b"k" * (MAX_KEY_BYTES + 1), NS, 1, ChecksumKind.CRC32, 0)
    with pytest.raises(RecordError, match="truncated"):
        decode_header(b"KVOFFBLK")
    with pytest.raises(ValueError, match="checksum"):
        resolve_checksum("sha1")
    with pytest.raises(TypeError):
        resolve_checksum(3)  # type: ignore[arg-type]


def _stamp_for(raw: bytes) -> bytearray:
    header = decode_header(raw)
    stamp = stamp_bytes(header.header_crc, header.write_id)
    return bytearray(stamp + bytes(STAMP_BYTES - len(stamp)))


def test_a_stamp_commits_exactly_its_own_header() -> None:
    raw = encode_header(b"key-1", NS, 10, ChecksumKind.CRC32, 5, written_ns=7, write_id=41)
    header = decode_header(raw)
    assert header.write_id == 41
    stamp = _stamp_for(raw)
    assert stamp_commits(stamp, header)
    # the same key and bytes written again (another write id): the old stamp does not commit it
    again = decode_header(encode_header(b"key-1", NS, 10, ChecksumKind.CRC32, 5, 7, write_id=42))
    assert not stamp_commits(stamp, again)
    # another record that happens to get the same write id: its header CRC differs
    other = decode_header(encode_header(b"key-2", NS, 10, ChecksumKind.CRC32, 5, 7, write_id=41))
    assert not stamp_commits(stamp, other)
    for offset in range(28):  # its 24 bytes of fields and their CRC (the rest is padding)
        bad = bytearray(stamp)
        bad[offset] ^= 0x10
        assert not stamp_commits(bad, header), offset
    assert not stamp_commits(bytes(STAMP_BYTES), header)  # a zeroed stamp: not committed
    assert not stamp_commits(stamp[:20], header)  # a stamp cut short by the file's end


def test_a_format_1_header_is_refused_by_its_version() -> None:
    """Format 1 put the header at the page's first byte and had no stamp."""
    fixed = struct.pack("<8sHHBBHQQQ32s", b"KVOFFBLK", 1, 4096, 1, 0, 5, 10, 0, 0, NS)
    raw = bytearray(HEADER_BYTES)
    crc = zlib.crc32(b"key-1", zlib.crc32(fixed))
    raw[: len(fixed) + 9] = fixed + struct.pack("<I", crc) + b"key-1"
    with pytest.raises(RecordError, match="format version 1"):
        decode_header(raw)
