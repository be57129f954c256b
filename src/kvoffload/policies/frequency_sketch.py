"""TinyLFU's frequency sketch: 4-bit count-min counters, a doorkeeper, and periodic halving.

W-TinyLFU must compare how often two blocks were used recently, including blocks it no longer
stores, in a few bytes per cached block. A count-min sketch (``DEPTH`` rows of 4-bit counters,
saturating at 15, held one per byte) never under-estimates; the doorkeeper (a Bloom filter)
absorbs each key's first use in a sample period so the many one-time keys do not pollute the
counters; after ``sample_size`` recorded uses every counter is halved and the doorkeeper
cleared, so old popularity fades (Einziger, Friedman & Manes, ACM TOS 2017).

Hashing is BLAKE2b of the key bytes, so estimates are identical in every process and run
(Python's ``hash`` of bytes is salted per process).
"""

from __future__ import annotations

import hashlib

MAX_COUNT = 15
DEPTH = 4
_DOOR_HASHES = 3
_HALVE = bytes(i >> 1 for i in range(256))
_MASK32 = 0xFFFFFFFF


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class FrequencySketch:
    """Approximate recent use counts for byte keys (0..15, plus 1 for the doorkeeper)."""

    __slots__ = (
        "_counters", "_door", "_door_mask", "_mask", "_width", "additions", "doorkeeper",
        "sample_size",
    )

    def __init__(self, expected_keys: int, *, sample_size: int, doorkeeper: bool = True) -> None:
        if sample_size < 1:
            raise ValueError(f"sample_size must be >= 1, got {sample_size}")
        self._width = _power_of_two_at_least(max(16, expected_keys))
        self._mask = self._width - 1
        self._counters = bytearray(self._width * DEPTH)  # row after row
        self.doorkeeper = doorkeeper
        # About 8 bits per use in a sample: a few % false positives with 3 hashes.
        door_bits = _power_of_two_at_least(max(64, 8 * sample_size)) if doorkeeper else 8
        self._door = bytearray(door_bits // 8)
        self._door_mask = door_bits - 1
        self.sample_size = sample_size
        self.additions = 0  # recorded uses in the current sample period

    @staticmethod
    def key_hash(key: bytes) -> int:
        """The 128-bit hash the sketch uses for ``key`` (callers may cache it per key)."""
        return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")

    def _in_door(self, key_hash: int) -> bool:
        door, mask = self._door, self._door_mask
        c = (key_hash >> 64) & _MASK32
        d = (key_hash >> 96) | 1
        bit0, bit1, bit2 = c & mask, (c + d) & mask, (c + 2 * d) & mask
        return bool(
            door[bit0 >> 3] & (1 << (bit0 & 7))
            and door[bit1 >> 3] & (1 << (bit1 & 7))
            and door[bit2 >> 3] & (1 << (bit2 & 7))
        )

    def _add_to_door(self, key_hash: int) -> None:
        door, mask = self._door, self._door_mask
        c = (key_hash >> 64) & _MASK32
        d = (key_hash >> 96) | 1
        for i in range(_DOOR_HASHES):
            bit = (c + i * d) & mask
            door[bit >> 3] |= 1 << (bit & 7)

    def _cells(self, key_hash: int) -> tuple[int, int, int, int]:
        width, mask = self._width, self._mask
        a = key_hash & _MASK32
        b = ((key_hash >> 32) & _MASK32) | 1
        return (
            a & mask,
            width + ((a + b) & mask),
            2 * width + ((a + 2 * b) & mask),
            3 * width + ((a + 3 * b) & mask),
        )

    def estimate(self, key: bytes) -> int:
        """Recent uses of ``key`` (an over-estimate only through hash collisions)."""
        return self.estimate_hash(self.key_hash(key))

    def estimate_hash(self, key_hash: int) -> int:
        """:meth:`estimate` for a key whose :meth:`key_hash` is ``key_hash``."""
        counters = self._counters
        c0, c1, c2, c3 = self._cells(key_hash)
        count = min(counters[c0], counters[c1], counters[c2], counters[c3])
        if self.doorkeeper and self._in_door(key_hash):
            count += 1
        return count

    def increment(self, key: bytes) -> None:
        """Record one use of ``key``; every ``sample_size`` uses, age everything by half."""
        self.increment_hash(self.key_hash(key))

    def increment_hash(self, key_hash: int) -> None:
        """:meth:`increment` for a key whose :meth:`key_hash` is ``key_hash``."""
        if self.doorkeeper and not self._in_door(key_hash):
            self._add_to_door(key_hash)
        else:
            counters = self._counters
            for cell in self._cells(key_hash):
                if counters[cell] < MAX_COUNT:
                    counters[cell] += 1
        self.additions += 1
        if self.additions >= self.sample_size:
            self.age()

    def age(self) -> None:
        """Halve every counter and clear the doorkeeper (the sample period restarts at half)."""
        self._counters = self._counters.translate(_HALVE)
        self._door = bytearray(len(self._door))
        self.additions //= 2

    def clear(self) -> None:
        """Forget everything."""
        self._counters = bytearray(len(self._counters))
        self._door = bytearray(len(self._door))
        self.additions = 0


__all__ = ["DEPTH", "MAX_COUNT", "FrequencySketch"]
