"""The offloading manager: block bookkeeping for a CPU tier (no data moves here).

:class:`CPUOffloadingManager` has vLLM's API (``lookup``, two-phase ``prepare_load`` /
``complete_load`` and ``prepare_store`` / ``complete_store``, ``on_new_request``,
``on_request_finished``, ``reset_cache``, ``take_events``, ``get_stats``,
``has_pending_work``, ``shutdown``), so a driver written for vLLM's manager runs unchanged,
with these semantics:

* ``keys`` arguments are any iterable of keys (lists, tuples, generators); a single
  ``bytes``/``str`` value where a collection is due is a ``TypeError``, and so is a key that
  is not ``bytes`` when it would enter the cache (see :mod:`.keyargs` for where each check is).
* Slots are handed out fresh first (0, 1, 2, ...), then reused last-freed-first.
* ``prepare_store`` offers each key once: a key repeated in the call is deduplicated in order
  (its first place counts), so ``keys_to_store`` never repeats a key. It skips keys already
  stored (ready ones count as a use, pending ones belong to another store), protects every
  offered key from eviction, and is all-or-nothing unless ``partial_store=True`` (then it
  stores the longest prefix of the new keys that fits). A store that cannot fit returns
  ``None``; when the evictable count alone says it cannot fit, the policy is not called and no
  cache state changes.
* A pending block (being written) is ``HIT_PENDING`` and never evicted; a block being read is
  pinned (counted once however many loads share it) and never evicted.
* Each request's access counts once per key for the policy (``touch`` is deduplicated per
  request and within a call), so repeated touches cannot inflate frequency-based policies.
* Completions: a failed store frees its slots and leaves no key behind. A duplicate completion
  (of a ready key, or one more than was prepared) is ignored (counted).
* ``reset_cache`` drops every block, but the slots of jobs in flight (a load still copying a
  slot out, a store still writing one) are *held*: not handed out again until that job's
  completion arrives (stale: counted, and changing nothing else) or
  :meth:`~CPUOffloadingManager.release_stale_slots` says the data plane finished them. Each
  request's jobs are stamped with the cache generation, so stale completions never touch
  new blocks. Completing a key that was never prepared raises ``ValueError`` and changes
  nothing.
* ``has_pending_work()`` is ``True`` while any store, load or held slot awaits its completion.
  ``shutdown()`` stops the manager: every later call raises ``RuntimeError`` (``get_stats``
  still reads the final counters).

Threading model: one thread calls the manager. When completions (or any call) come from other
threads, build it with ``thread_safe=True``: every public method then holds one lock (see
``docs/findings.md`` for its cost). Without it, a call that changes state from
a second thread raises ``RuntimeError`` before changing anything (``lookup``, per key and
changing only counters, is not checked; ``get_stats`` may be read from any thread).

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
