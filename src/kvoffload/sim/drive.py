"""The simulator's blocks mode: every block an independent access, made fast.

:func:`access_blocks` treats each key of a request as one access, in order, in one call
(libCacheSim's model): a HIT is loaded (``prepare_load`` + ``complete_load``), a MISS is
stored (``prepare_store`` + ``complete_store``), a HIT_PENDING is left alone. It makes the
same policy calls and leaves the same counters, slots and statuses as that per-key call
sequence (``tests/sim/test_drive.py`` checks it), without its per-call cost: the blocks mode
is bound by it. The manager's :meth:`~kvoffload.manager.CPUOffloadingManager.access_each`
makes it (on the block ledger, where the protocol is written once); with admission filters,
events, observers (shadow policies) or a recorder on, it makes exactly the public calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager import BlockAccesses, CPUOffloadingManager, LookupResult

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT


def access_blocks(
    m: CPUOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> BlockAccesses:
    """Each of ``keys`` as an independent access to ``m``, in order (see the module)."""
    if m.admission is not None or m.events_enabled or m.observers or m.recorder is not None:
        return access_blocks_by_calls(m, keys, ctx)
    return m.access_each(keys, ctx)


def access_blocks_by_calls(
    m: CPUOffloadingManager, keys: Sequence[OffloadKey], ctx: ReqContext
) -> BlockAccesses:
    """:func:`access_blocks` made of the public calls (admission filters and events need
    them; it is also the definition the fast path is tested against)."""
    results: list[LookupResult] = []
    stored = evicted = failed = 0
    for key in keys:
        result = m.lookup(key, ctx)
        results.append(result)
        one = [key]
        if result is _HIT:
            m.prepare_load(one, ctx)
            m.complete_load(one, ctx)
        elif result is _MISS:
            out = m.prepare_store(one, ctx)
            if out is None:
                failed += 1
            elif out.keys_to_store:
                m.complete_store(out.keys_to_store, ctx)
                stored += 1
                evicted += len(out.evicted_keys)
    return BlockAccesses(results, stored, evicted, failed)


__all__ = ["access_blocks", "access_blocks_by_calls"]
