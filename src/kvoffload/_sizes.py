"""Byte sizes as people write them (``8GiB``, ``500MB``, ``4096``): the one parser for them.

Every byte parameter (``cpu_bytes``, ``cpu_bytes_to_use``, a tier's ``capacity_bytes``, the
CLI's ``--disk-bytes`` and byte capacities) reads sizes here, so a size accepted in one place
is accepted in all, with the same message naming the parameter when it is not. Units:
``B``, ``KB``, ``MB``, ``GB``, ``TB`` (decimal) and ``KiB``, ``MiB``, ``GiB``, ``TiB``
(binary), any case. Arithmetic is exact (``1.5GiB`` is exactly 1,610,612,736 bytes; a
fraction of a byte left by a decimal size is dropped). A float is taken when it is a whole
number of bytes (``2.0**30``); ``cpu_bytes_to_use`` alone floors any float, as vLLM computes
it (``GiB * 2**30``).
"""

from __future__ import annotations

import re
from fractions import Fraction

#: Bytes per unit, by the unit's upper-case spelling.
BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
#: What a size parameter accepts, for messages.
SIZE_ACCEPTS = (
    "bytes: an int or a size like '8GiB' (B, KB, MB, GB, TB decimal; KiB, MiB, GiB, TiB binary)"
)
_SIZE_RE = re.compile(
    r"^\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[kmgt]?i?b)?\s*$", re.IGNORECASE
)


def exact_bytes(text: str, unit_required: bool = False) -> Fraction | None:
    """The exact bytes ``text`` spells (``"1.5GiB"``), or None when it is not a size.

    ``unit_required``: a bare number is not a size (the simulator's capacities read it as
    blocks). Fractions stay: a caller that divides (bytes into blocks) rounds once, at the end.
    """
    match = _SIZE_RE.match(text)
    if match is None or (unit_required and match["unit"] is None):
        return None
    unit = (match["unit"] or "B").upper()
    if unit not in BYTE_UNITS:
        return None
    return Fraction(match["num"]) * BYTE_UNITS[unit]


def parse_size(name: str, value: object, low: int | None = 0) -> int:
    """``value`` (an int, a whole float, or a size string) as bytes, at least ``low``.

    ``TypeError`` for another type (``bool`` included), ``ValueError`` for text that is not
    a size or a size below ``low``; both name ``name`` and say what it accepts. ``low=None``
    leaves the range to the caller (whose own check names the bound).
    """
    accepts = f"{SIZE_ACCEPTS}{f', at least {low}' if low else ''}"
    whole_float = isinstance(value, float) and value.is_integer()
    if isinstance(value, bool) or (not isinstance(value, (int, str)) and not whole_float):
        raise TypeError(f"{name} must be {accepts}, got {type(value).__name__} {value!r}")
    if isinstance(value, (int, float)):
        size = int(value)
    else:
        exact = exact_bytes(str(value))
        if exact is None:
            raise ValueError(f"{name} must be {accepts}; cannot read {value!r} as a size")
        size = int(exact)
    if low is not None and size < low:
        raise ValueError(f"{name} must be {accepts}, got {value!r}")
    return size


def format_size(nbytes: float) -> str:
    """A short binary size for messages (``72.0 GiB``)."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # unreachable: the loop returns at TiB


__all__ = ["BYTE_UNITS", "SIZE_ACCEPTS", "exact_bytes", "format_size", "parse_size"]
