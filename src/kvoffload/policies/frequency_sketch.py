"""TinyLFU's frequency sketch: 4-bit count-min counters, a doorkeeper, and periodic halving.

W-TinyLFU must compare how often two blocks were used recently, including blocks it no longer
stores, in a few bytes per cached block. A count-min sketch (``DEPTH`` rows of 4-bit counters,
saturating at 15, held one per byte) never under-estimates; the doorkeeper (a Bloom filter)
absorbs each key's first use in a sample period so the many one-time keys do not pollute the
counters; after ``sample_size`` recorded uses every counter is halved and the doorkeeper
cleared, so old popularity fades (Einziger, Friedman & Manes, ACM TOS 2017). For speed in pure
Python the doorkeeper holds each of its bits in a byte (8 to 16 bytes per use in a sample).

Hashing is BLAKE2b of the key bytes, so estimates are identical in every process and run
(Python's ``hash`` of bytes is salted per process).
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

MAX_COUNT = 15
DEPTH = 4
_HALVE = bytes(i >> 1 for i in range(256))
_HASHER = blake2b(digest_size=16)  # copied per key: cheaper than a new one with parameters


def _power_of_two_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class FrequencySketch:
    """Approximate recent use counts for byte keys (0..15, plus 1 for the doorkeeper).

    A key's 128-bit hash, as 32-bit words ``w0..w3`` (least significant first), places it:
    counter ``i`` of row ``i`` is ``(w0 + i * (w1 | 1)) mod width``, doorkeeper bit ``j`` is
    ``(w2 + j * (w3 | 1)) mod bits``. Both moduli are powers of two, so the arithmetic is done
    on the words' low bits only (the results are the same).
    """

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
        # About 8 bits per use in a sample: a few % false positives with 3 hashes. Each bit is
        # held in a byte of its own (0 or 1): 8 times the memory of packed bits, but testing
        # or setting one is a single indexing operation.
        door_bits = _power_of_two_at_least(max(64, 8 * sample_size)) if doorkeeper else 8
        self._door = bytearray(door_bits)
        self._door_mask = door_bits - 1
        self.sample_size = sample_size
        self.additions = 0  # recorded uses in the current sample period

    @staticmethod
    def key_hash(key: bytes) -> int:
        """The 128-bit hash the sketch uses for ``key`` (callers may cache it per key)."""
        hasher = _HASHER.copy()
        hasher.update(key)
        return int.from_bytes(hasher.digest(), "little")

    @staticmethod
    def key_hashes(keys: Iterable[bytes]) -> list[int]:
        """:meth:`key_hash` of each of ``keys``, in order."""
        copy, from_bytes = _HASHER.copy, int.from_bytes
        out: list[int] = []
        append = out.append
        for key in keys:
            hasher = copy()
            hasher.update(key)
            append(from_bytes(hasher.digest(), "little"))
        return out

    def estimate(self, key: bytes) -> int:
        """Recent uses of ``key`` (an over-estimate only through hash collisions)."""
        return self.estimate_hash(self.key_hash(key))

    def estimate_hash(self, key_hash: int) -> int:
        """:meth:`estimate` for a key whose :meth:`key_hash` is ``key_hash``."""
        counters, width, mask = self._counters, self._width, self._mask
        a = key_hash & mask
        b = ((key_hash >> 32) & mask) | 1
        count = counters[a]
        a += b
        other = counters[width + (a & mask)]
        if other < count:
            count = other
        a += b
        other = counters[2 * width + (a & mask)]
        if other < count:
            count = other
        other = counters[3 * width + ((a + b) & mask)]
        if other < count:
            count = other
        if self.doorkeeper:
            door, door_mask = self._door, self._door_mask
            bit = (key_hash >> 64) & door_mask
            step = ((key_hash >> 96) & door_mask) | 1
            if door[bit] and door[(bit + step) & door_mask] and door[(bit + 2 * step) & door_mask]:
                count += 1
        return count

    def increment(self, key: bytes) -> None:
        """Record one use of ``key``; every ``sample_size`` uses, age everything by half."""
        self.increment_hashes((self.key_hash(key),))

    def increment_hash(self, key_hash: int) -> None:
        """:meth:`increment` for a key whose :meth:`key_hash` is ``key_hash``."""
        self.increment_hashes((key_hash,))

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

    def _record(self, key_hashes: list[int]) -> None:
        """Record the uses (within one sample period: no aging, no counting here)."""
        counters, door = self._counters, self._door
        width, mask, door_mask = self._width, self._mask, self._door_mask
        width2, width3 = 2 * width, 3 * width
        doorkeeper = self.doorkeeper
        for key_hash in key_hashes:
            if doorkeeper:
                bit0 = (key_hash >> 64) & door_mask
                step = ((key_hash >> 96) & door_mask) | 1
                bit1 = (bit0 + step) & door_mask
                bit2 = (bit1 + step) & door_mask
                if not (door[bit0] and door[bit1] and door[bit2]):
                    door[bit0] = door[bit1] = door[bit2] = 1
                    continue
            a = key_hash & mask
            b = ((key_hash >> 32) & mask) | 1
            if counters[a] < MAX_COUNT:
                counters[a] += 1
            a += b
            cell = width + (a & mask)
            if counters[cell] < MAX_COUNT:
                counters[cell] += 1
            a += b
            cell = width2 + (a & mask)
            if counters[cell] < MAX_COUNT:
                counters[cell] += 1
            cell = width3 + ((a + b) & mask)
            if counters[cell] < MAX_COUNT:
                counters[cell] += 1

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
