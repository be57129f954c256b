"""Small helpers the policies share when they pick victims or read block states in bulk."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from operator import attrgetter

from kvoffload.keys import OffloadKey

# ``BlockStatus.ref_cnt`` as a C-level getter: ``0 in map(ref_count, blocks)`` finds a ready
# block among many without a Python loop (the manager inserts pending blocks, so usually none).
ref_count = attrgetter("ref_cnt")


def protected_disjoint(protected: Collection[OffloadKey], keys: list[OffloadKey]) -> bool:
    """True when none of ``keys`` is protected (a set operation when ``protected`` is a set)."""
    if isinstance(protected, (set, frozenset)):
        return protected.isdisjoint(keys)
    return not any(key in protected for key in keys)


def next_unprotected(
    it: Iterator[OffloadKey], protected: Collection[OffloadKey]
) -> OffloadKey | None:
    """The next key of ``it`` that is not protected, or ``None`` when ``it`` runs out."""
    for key in it:
        if key not in protected:
            return key
    return None


__all__ = ["next_unprotected", "protected_disjoint", "ref_count"]
