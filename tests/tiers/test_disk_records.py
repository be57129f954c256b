"""The record header: round trip, and every damaged or foreign header refused with a reason."""

from __future__ import annotations

import pytest

from kvoffload.tiers.disk.records import (
    HEADER_BYTES,
    MAX_KEY_BYTES,
    ChecksumKind,
    RecordError,
    decode_header,
    encode_header,
    is_empty,
    resolve_checksum,
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
    assert header.record_bytes == HEADER_BYTES + 12345
    assert not is_empty(raw) and is_empty(bytes(HEADER_BYTES))


@pytest.mark.parametrize(
    ("offset", "message"),
    [(0, "magic"), (8, "version"), (20, "checksum"), (60, "checksum"), (70, "checksum")],
)
def test_a_damaged_header_is_refused(offset: int, message: str) -> None:
    raw = bytearray(encode_header(b"key-1234", NS, 10, ChecksumKind.XXH3_64, 5))
    raw[offset] ^= 0x04
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
