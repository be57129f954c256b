"""TinyLFU's frequency sketch: 4-bit count-min counters, a doorkeeper, and periodic halving.

W-TinyLFU must compare how often two blocks were used recently, including blocks it no longer
stores, in a few bytes per cached block. A count-min sketch (``DEPTH`` rows of 4-bit counters,
saturating at 15, held one per byte) never under-estimates; the doorkeeper (a Bloom filter)
absorbs each key's first use in a sample period so the many one-time keys do not pollute the
counters; after ``sample_size`` recorded uses every counter is halved and the doorkeeper
cleared, so old popularity fades (Einziger, Friedman & Manes, ACM TOS 2017). For speed in pure
Python the doorkeeper holds each of its bits in a byte (8 to 16 bytes per use in a sample).

Memory follows use: a row or doorkeeper larger than ``DENSE_BYTES`` starts sparse (a dict of
the places that are not 0, indexed like the array) and becomes a byte array once it
fills past 1/64, so a 10**7-block cache allocates nothing like its 1 GB doorkeeper up front.
Both forms hold the same counters at the same places: estimates, and so decisions, are
identical.

Hashing is the key's CRC-32 (every byte counts, the group index included) spread by
multiply-shift: multiplied by a fixed odd 288-bit constant (2**288 divided by the golden
ratio), whose disjoint 32-bit windows above the product's 32nd bit (each a function of the
whole CRC) place the key. CRC-32 and integer arithmetic have no salt, so estimates are
identical in every process, run and platform (Python's ``hash`` of bytes is salted per
process). Keys are content hashes in practice, so a cheap fingerprint is enough (a
cryptographic hash cost several times more per use); two keys share all their places only if
their CRCs collide, which is rare next to the sketch's own counter collisions.
"""

from __future__ import annotations

from binascii import crc32
from collections.abc import Iterable
from math import isqrt
from typing import Any

MAX_COUNT = 15
DEPTH = 4
_HALVE = bytes(i >> 1 for i in range(256))
_INC = [*range(1, MAX_COUNT + 1), MAX_COUNT]  # saturating increment of a counter, by lookup
_MIX = ((isqrt(5 << 576) - (1 << 288)) >> 1) | 1  # floor(2**288 / golden ratio), made odd
_FIELD = 32  # bits per window: row and doorkeeper sizes are at most 2**32
_MAX_SIZE = 1 << _FIELD
#: Rows and doorkeepers up to this many bytes are byte arrays from the start.
DENSE_BYTES = 1 << 20
_FILL = 64  # a sparse row / doorkeeper becomes dense past 1/_FILL of its size in entries


class _Sparse(dict[int, int]):
    """A row or doorkeeper held as {place: value} for the places that are not 0: indexed
    like the byte array it stands for (a missing place reads 0 and is not added)."""

    def __missing__(self, key: int) -> int:
        return 0


def _dense(sparse: _Sparse, size: int) -> bytearray:
    out = bytearray(size)
    for place, value in sparse.items():
        out[place] = value
    return out


def _power_of_two_at_least(n: int) -> int:
    return min(1 << max(0, n - 1).bit_length(), _MAX_SIZE)


class FrequencySketch:
    """Approximate recent use counts for byte keys (0..15, plus 1 for the doorkeeper).

    A key's hash ``h`` (see the module docstring) holds seven 32-bit windows, least significant
    first: doorkeeper bits ``j = 0..2`` are windows 0..2 modulo the doorkeeper's size, and the
    key's counter in row ``i = 0..3`` is window ``3 + i`` modulo the row width. Both sizes are
    powers of two, so a window's low bits are taken by a mask.
    """

    __slots__ = (
        "_door",
        "_door_mask",
        "_mask",
        "_rows",
        "_sparse",
        "_width",
        "additions",
        "doorkeeper",
        "sample_size",
    )

    def __init__(self, expected_keys: int, *, sample_size: int, doorkeeper: bool = True) -> None:
        if sample_size < 1:
            raise ValueError(f"sample_size must be >= 1, got {sample_size}")
        self._width = _power_of_two_at_least(max(16, expected_keys))
        self._mask = self._width - 1
        self.doorkeeper = doorkeeper
        # About 8 bits per use in a sample: a few % false positives with 3 hashes. Each bit is
        # held in a byte of its own (0 or 1): 8 times the memory of packed bits, but testing
        # or setting one is a single indexing operation.
        door_bits = _power_of_two_at_least(max(64, 8 * sample_size)) if doorkeeper else 8
        self._door_mask = door_bits - 1
        self._rows: tuple[Any, ...] = self._new_rows()
        self._door: Any = self._new_door()
        self.sample_size = sample_size
        self.additions = 0  # recorded uses in the current sample period

    @staticmethod
    def key_hash(key: bytes) -> int:
        """The hash the sketch uses for ``key`` (callers may cache it per key)."""
        return crc32(key) * _MIX >> 32

    @staticmethod
    def key_hashes(keys: Iterable[bytes]) -> list[int]:
        """:meth:`key_hash` of each of ``keys``, in order."""
        crc, mix = crc32, _MIX
        return [crc(key) * mix >> 32 for key in keys]

    def estimate(self, key: bytes) -> int:
        """Recent uses of ``key`` (an over-estimate only through hash collisions)."""
        return self.estimate_hash(self.key_hash(key))

    def estimate_hash(self, key_hash: int) -> int:
        """:meth:`estimate` for a key whose :meth:`key_hash` is ``key_hash``."""
        row0, row1, row2, row3 = self._rows
        mask = self._mask
        count: int = min(
            row0[key_hash >> 96 & mask],
            row1[key_hash >> 128 & mask],
            row2[key_hash >> 160 & mask],
            row3[key_hash >> 192 & mask],
        )
        if self.doorkeeper:
            door, door_mask = self._door, self._door_mask
            if (
                door[key_hash & door_mask]
                and door[key_hash >> 32 & door_mask]
                and door[key_hash >> 64 & door_mask]
            ):
                count += 1
        return count

    def increment(self, key: bytes) -> None:
        """Record one use of ``key``; every ``sample_size`` uses, age everything by half."""
        self.increment_hashes((self.key_hash(key),))

    def increment_hash(self, key_hash: int) -> None:
        """:meth:`increment` for a key whose :meth:`key_hash` is ``key_hash``."""
        self.increment_hashes((key_hash,))

    def increment_keys(self, keys: Iterable[bytes]) -> None:
        """:meth:`increment` for each of ``keys``, in order."""
        if not isinstance(keys, (list, tuple)):
            keys = list(keys)
        if self.additions + len(keys) >= self.sample_size:
            self.increment_hashes(self.key_hashes(keys))  # (aging within: in runs)
            return
        self._record(keys, hashed=False)  # the usual case: hashing fused with recording
        self.additions += len(keys)

    def increment_hashes(self, key_hashes: Iterable[int]) -> None:
        """:meth:`increment_hash` for each of ``key_hashes``, in order.

        A use of a key that is not in the doorkeeper only enters it there; otherwise each of
        the key's ``DEPTH`` counters below ``MAX_COUNT`` goes up by one. The uses are recorded
        in runs that end where the sample period does (then everything ages).
        """
        hashes = key_hashes if isinstance(key_hashes, list) else list(key_hashes)
        if self.additions + len(hashes) < self.sample_size:  # the usual case: no aging within
            self._record(hashes)
            self.additions += len(hashes)
            return
        start = 0
        while start < len(hashes):
            end = start + self.sample_size - self.additions  # the use that completes the period
            self._record(hashes[start:end] if start or end < len(hashes) else hashes)
            self.additions += min(end, len(hashes)) - start
            if self.additions >= self.sample_size:
                self.age()
            start = end

    def _record(self, items: Iterable[Any], hashed: bool = True) -> None:
        """Record the uses of ``items``, hashes or (``hashed=False``) keys, within one sample
        period: no aging, no counting here."""
        row0, row1, row2, row3 = self._rows
        mask, inc = self._mask, _INC
        door, door_mask = self._door, self._door_mask
        doorkeeper = self.doorkeeper
        crc, mix = crc32, _MIX
        for item in items:
            h: int = item if hashed else crc(item) * mix >> 32
            if doorkeeper:
                bit0 = h & door_mask
                bit1 = h >> 32 & door_mask
                bit2 = h >> 64 & door_mask
                if not (door[bit0] and door[bit1] and door[bit2]):
                    door[bit0] = door[bit1] = door[bit2] = 1
                    continue
            cell = h >> 96 & mask
            row0[cell] = inc[row0[cell]]
            cell = h >> 128 & mask
            row1[cell] = inc[row1[cell]]
            cell = h >> 160 & mask
            row2[cell] = inc[row2[cell]]
            cell = h >> 192 & mask
            row3[cell] = inc[row3[cell]]
        if self._sparse:
            self._densify()

    def _new_rows(self) -> tuple[Any, ...]:
        sparse = self._width > DENSE_BYTES
        self._sparse = sparse or self._door_mask + 1 > DENSE_BYTES
        return tuple(_Sparse() if sparse else bytearray(self._width) for _ in range(DEPTH))

    def _new_door(self) -> Any:
        size = self._door_mask + 1
        return _Sparse() if size > DENSE_BYTES else bytearray(size)

    def _densify(self) -> None:
        """Turn each sparse row or doorkeeper past 1/``_FILL`` full into a byte array."""
        rows = list(self._rows)
        for i, row in enumerate(rows):
            if isinstance(row, _Sparse) and len(row) * _FILL > self._width:
                rows[i] = _dense(row, self._width)
        self._rows = tuple(rows)
        door = self._door
        if isinstance(door, _Sparse) and len(door) * _FILL > self._door_mask + 1:
            self._door = _dense(door, self._door_mask + 1)
        self._sparse = any(isinstance(x, _Sparse) for x in (*self._rows, self._door))

    def age(self) -> None:
        """Halve every counter and clear the doorkeeper (the sample period restarts at half)."""
        self._rows = tuple(
            _Sparse({cell: count >> 1 for cell, count in row.items() if count > 1})
            if isinstance(row, _Sparse)
            else row.translate(_HALVE)
            for row in self._rows
        )
        self._door = _Sparse() if isinstance(self._door, _Sparse) else bytearray(len(self._door))
        self.additions //= 2

    def clear(self) -> None:
        """Forget everything (and give the memory back: a large sketch is sparse again)."""
        self._rows = self._new_rows()
        self._door = self._new_door()
        self.additions = 0


__all__ = ["DENSE_BYTES", "DEPTH", "MAX_COUNT", "FrequencySketch"]
