"""Small helpers the policies share when they pick victims, keep eviction orders or read block
states in bulk."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import chain, filterfalse, islice
from operator import attrgetter
from typing import TYPE_CHECKING

from kvoffload.keys import OffloadKey

if TYPE_CHECKING:
    from kvoffload.policies.base import BlockStatus

# ``BlockStatus.ref_cnt`` as a C-level getter: ``0 in map(ref_count, blocks)`` finds a ready
# block among many without a Python loop (the manager inserts pending blocks, so usually none).
ref_count = attrgetter("ref_cnt")


def ready_keys(keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]) -> list[OffloadKey]:
    """The keys of a batched insert whose blocks came in ready (``ref_cnt == 0``), in order.

    Usually none (the manager inserts pending blocks), found by one C-level pass.
    """
    if 0 not in map(ref_count, blocks):
        return []
    return [key for key, block in zip(keys, blocks, strict=True) if block.ref_cnt == 0]


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


def first_unprotected(
    orders: Iterable[Iterable[OffloadKey]], n: int, protected: Collection[OffloadKey]
) -> list[OffloadKey] | None:
    """The first ``n`` keys that are not protected, through ``orders`` one after the other
    (each in eviction order), or ``None`` when there are fewer."""
    keys = chain.from_iterable(orders)
    chosen = list(islice(filterfalse(protected.__contains__, keys), n))
    return chosen if len(chosen) == n else None


def append_absent(order: OrderedDict[OffloadKey, None], keys: Sequence[OffloadKey]) -> None:
    """Append ``keys``, none of them in ``order`` yet, at its most recent end, in order.

    A key given twice ends where its last occurrence puts it, as marking each key in turn
    (append or move to the end) would.
    """
    before = len(order)
    for key in keys:  # faster than OrderedDict.update
        order[key] = None
    if len(order) - before < len(keys):
        for key in keys:
            order.move_to_end(key)


__all__ = [
    "append_absent",
    "first_unprotected",
    "next_unprotected",
    "protected_disjoint",
    "ready_keys",
    "ref_count",
]
