"""The offloading manager: block bookkeeping for a CPU tier (no data moves here).

:class:`CPUOffloadingManager` has vLLM's ``OffloadingManager`` API, so a driver written for
vLLM's manager runs unchanged; what it guarantees (slots, stores, pins, completions, resets,
keys, threads) is listed in ``docs/manager.md``.

Modules: :mod:`.api` (types and the ABC), :mod:`.ledger` (a policy and its slots: the one
place where a block's status changes), :mod:`.pool` (slots), :mod:`.counters`,
:mod:`.records` (per-request state), :mod:`.keyargs` (argument checks), :mod:`.locked`,
:mod:`.observers` (what the manager tells components that watch its key stream, such as
shadows), :mod:`.cpu` (the manager).
"""

from kvoffload.manager.api import (
    BlockAccesses,
    CPULoadStoreSpec,
    LookupResult,
    OffloadingManager,
    OffloadingStats,
    PrepareStoreOutput,
    RequestOffloadingContext,
)
from kvoffload.manager.counters import Counters
from kvoffload.manager.cpu import CPUOffloadingManager
from kvoffload.manager.ledger import BlockLedger
from kvoffload.manager.locked import locked_class
from kvoffload.manager.observers import AccessObserver
from kvoffload.manager.pool import SlotPool
from kvoffload.manager.recorder import TraceRecorder

__all__ = [
    "AccessObserver",
    "BlockAccesses",
    "BlockLedger",
    "CPULoadStoreSpec",
    "CPUOffloadingManager",
    "Counters",
    "LookupResult",
    "OffloadingManager",
    "OffloadingStats",
    "PrepareStoreOutput",
    "RequestOffloadingContext",
    "SlotPool",
    "TraceRecorder",
    "locked_class",
]
