"""LRU stack distances (Mattson et al., 1970): one pass gives LRU's hits at every capacity.

An access's stack distance is the number of *distinct* other blocks used since the block's
previous access (``-1`` for a first access). An LRU cache of ``C`` blocks hits exactly the
accesses whose distance is below ``C``, because LRU keeps the ``C`` most recently used
blocks; so a histogram of distances is the whole LRU hit-ratio curve.

Two implementations, equal on every input (``tests/sim/test_stack_distance.py``):

* :func:`stack_distances_fenwick`: the textbook one pass, a Fenwick tree over the access
  times that holds a 1 at each block's latest access; the distance is the number of ones
  after the previous access. Standard library only, O(n log n).
* :func:`stack_distances` (numpy, the ``[mrc]`` extra): the same counts made offline in
  vectorised passes. With ``p`` the previous access of access ``i``, the blocks used in
  ``(p, i)`` that are not used again before ``i`` are the distinct ones, so
  ``d(i) = i - p - 1 - #{m < i : prev(m) > p}``; the last term counts, for each access,
  the earlier accesses whose previous access is later than its own (an inversion count),
  made one bit of ``prev`` at a time from the top (a radix partition per bit, O(n) each).
  O(n log n) in C loops instead of Python ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLD = -1  # the distance of a block's first access: no LRU cache of any size hits it


def stack_distances_fenwick(ids: Sequence[int]) -> list[int]:
    """Each access's LRU stack distance (``COLD`` for a first access), in pure Python."""
    n = len(ids)
    tree = [0] * (n + 1)  # Fenwick tree over access times 1..n
    last: dict[int, int] = {}
    out: list[int] = []
    live = 0  # ones in the tree: the distinct blocks seen so far
    for time, block in enumerate(ids, 1):
        prev = last.get(block)
        if prev is None:
            out.append(COLD)
            live += 1
        else:
            # ones at times <= prev: a prefix sum
            count = 0
            j = prev
            while j > 0:
                count += tree[j]
                j -= j & -j
            # Ones after prev: the blocks whose latest access came later (the block's own
            # one sits at prev), i.e. the distinct other blocks used since.
            out.append(live - count)
            j = prev
            while j <= n:
                tree[j] -= 1
                j += j & -j
        last[block] = time
        j = time
        while j <= n:
            tree[j] += 1
            j += j & -j
    return out


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        raise ImportError(
            "fast stack distances need numpy: pip install 'kvoffload[mrc]' (or numpy)"
        ) from None
    return numpy


def previous_access(ids: Any) -> Any:
    """Each access's previous access to the same block (``-1``: none), as a numpy array."""
    np = _numpy()
    ids = np.asarray(ids)
    n = len(ids)
    index = np.int32 if n < 2**31 else np.int64
    order = np.argsort(ids, kind="stable").astype(index, copy=False)
    ordered = ids[order]
    same = ordered[1:] == ordered[:-1]
    prev = np.full(n, -1, dtype=index)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def earlier_greater(values: Any) -> Any:
    """For each element of ``values`` (distinct non-negative ints), how many earlier elements
    are greater (see the module docstring: one stable radix partition per bit, top bit first).

    Elements are kept grouped by their bits above the current one, in index order inside a
    group; an element whose current bit is 0 is below every earlier element of its group
    whose bit is 1, and above the others at this bit, so each level adds, to each 0-bit
    element, the 1-bit elements before it in its group.
    """
    np = _numpy()
    values = np.asarray(values)
    k = len(values)
    index = np.int32 if k < 2**31 else np.int64
    out = np.zeros(k, dtype=index)
    if k < 2:
        return out
    bits = int(values.max()).bit_length()
    perm = np.arange(k, dtype=index)
    positions = np.arange(k, dtype=index)
    for bit in range(bits - 1, -1, -1):
        v = values[perm]
        high = v >> (bit + 1)
        one = ((v >> bit) & 1).astype(index)
        starts = np.flatnonzero(np.concatenate(([True], high[1:] != high[:-1])))
        lengths = np.diff(np.append(starts, k))
        start_of = np.repeat(starts.astype(index), lengths)
        ones_incl = np.cumsum(one, dtype=index)
        ones_excl = ones_incl - one
        ones_before = ones_excl - ones_excl[start_of]  # 1-bit elements earlier in the group
        zero = one == 0
        out[perm[zero]] += ones_before[zero]
        group_ones = np.repeat(
            (ones_incl[starts + lengths - 1] - ones_excl[starts]).astype(index), lengths
        )
        rank = positions - start_of
        zeros_total = np.repeat(lengths.astype(index), lengths) - group_ones
        new_pos = np.where(
            zero, start_of + (rank - ones_before), start_of + zeros_total + ones_before
        )
        next_perm = np.empty_like(perm)
        next_perm[new_pos] = perm
        perm = next_perm
    return out


def stack_distances(ids: Any) -> Any:
    """Each access's LRU stack distance (``COLD`` for a first access), as a numpy int64 array."""
    np = _numpy()
    ids = np.asarray(ids)
    prev = previous_access(ids)
    warm = np.flatnonzero(prev >= 0)
    p = prev[warm]
    del prev
    distances = np.full(len(ids), COLD, dtype=np.int64)
    distances[warm] = warm - p - 1 - earlier_greater(p)
    return distances


__all__ = [
    "COLD",
    "earlier_greater",
    "previous_access",
    "stack_distances",
    "stack_distances_fenwick",
]
