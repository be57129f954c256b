"""The one byte-size parser (``kvoffload._sizes``) every byte parameter reads."""

from __future__ import annotations

import pytest

from kvoffload._sizes import BYTE_UNITS, format_size, parse_size
from kvoffload.sim.capacity import parse_capacity
from kvoffload.tiers.config import parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("8GiB", 8 << 30),
        ("8gib", 8 << 30),
        ("8GIB", 8 << 30),  # any case, as the simulator's capacities always took
        ("500MB", 500 * 10**6),
        (" 1.5 MiB ", 3 << 19),
        (".5KiB", 512),
        ("2TB", 2 * 10**12),
        (1 << 40, 1 << 40),
        (2.0**30, 1 << 30),
    ],
)
def test_sizes(text: object, expected: int) -> None:
    assert parse_size("x", text) == expected
    assert parse_bytes("tiers[0].capacity_bytes", text) == expected


@pytest.mark.parametrize(
    ("value", "error"),
    [("8 lots", ValueError), ("-1", ValueError), ("8G", ValueError), (True, TypeError)],
)
def test_not_sizes_name_the_parameter_and_what_it_accepts(value: object, error: type) -> None:
    with pytest.raises(error, match=r"^cpu_bytes must be bytes: an int or a size like '8GiB'"):
        parse_size("cpu_bytes", value, 1)
    for bad in (1.5, [1]):
        with pytest.raises(TypeError, match=r"^cpu_bytes must be bytes"):
            parse_size("cpu_bytes", bad)


def test_the_simulator_capacities_read_the_same_units() -> None:
    # One byte per block (512 tokens of 1/512 byte): the capacity in blocks is the bytes.
    for unit, factor in BYTE_UNITS.items():
        for spelled in (unit, unit.lower(), unit.upper()):
            blocks = parse_capacity(f"1{spelled}", 10, 512, 1 / 512).blocks
            assert blocks == factor == parse_size("x", f"1{spelled}"), spelled


def test_format_size() -> None:
    assert format_size(512) == "512 B" and format_size(72 * 2**30) == "72.0 GiB"
    assert format_size(1 << 50) == "1024.0 TiB"
