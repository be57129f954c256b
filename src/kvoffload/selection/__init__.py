"""Policy selection: shadows that estimate candidates, warm switching, and ``auto``.

Everything that chooses a policy while a cache runs is here, one floor above the manager
(``pyproject.toml``'s layers): the shadows' miniatures can stand on the manager's
:class:`~kvoffload.manager.ledger.BlockLedger`, and the manager imports none of it. A manager
that should feed shadows is handed them as an observer by whoever builds it.

* :mod:`~kvoffload.selection.shadow`: :class:`ShadowEvaluator`, hash-sampled miniature
  simulations of candidate policies (SHARDS) and their estimates;
* :mod:`~kvoffload.selection.switching`: :func:`warm_switch`, a new policy that replays the
  recent accesses before it takes the resident set (the move itself,
  :func:`switch_resident_set`, is the policies' floor's, re-exported here);
* :mod:`~kvoffload.selection.auto`: :class:`AutoCachePolicy`, the built-in policy ``auto``
  (resolved by name with the other built-ins: ``create_cache_policy("auto", ...)``).
"""

from __future__ import annotations

from kvoffload.selection.auto import DEFAULT_CANDIDATES, AutoCachePolicy, PolicySwitch
from kvoffload.selection.shadow import (
    ShadowEstimate,
    ShadowEvaluator,
)
from kvoffload.selection.switching import (
    HistoryEntry,
    SwitchReport,
    switch_resident_set,
    warm_switch,
)

__all__ = [
    "DEFAULT_CANDIDATES",
    "AutoCachePolicy",
    "HistoryEntry",
    "PolicySwitch",
    "ShadowEstimate",
    "ShadowEvaluator",
    "SwitchReport",
    "switch_resident_set",
    "warm_switch",
]
