"""Prometheus exposition of a manager's stats (needs the ``[metrics]`` extra).

The collector reads ``manager.get_stats()`` at scrape time, so the hot path pays nothing:
no counter is incremented twice. Counters are exported as Prometheus counters (``_total``),
occupancy as gauges, and the policy's own gauges (ARC's target, ghost sizes, ...) as
``<prefix>_policy_<name>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvoffload.manager import OffloadingManager

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kvoffload.metrics needs prometheus-client: pip install 'kvoffload[metrics]'"
    ) from exc

_COUNTERS = {
    "lookups": "Lookups of one key.",
    "hits": "Lookups that found a readable block.",
    "hits_pending": "Lookups that found a block still being written.",
    "misses": "Lookups that found nothing.",
    "loads": "Blocks pinned for reading.",
    "stores_prepared": "Blocks allocated for writing.",
    "stores_completed": "Blocks whose write completed.",
    "stores_failed": "Blocks whose write failed (freed).",
    "admission_rejects": "Blocks an admission filter refused to store.",
    "evictions": "Blocks evicted to make room.",
    "failed_allocations": "Stores refused for lack of room.",
    "stale_completions": "Completions of jobs prepared before a reset (ignored).",
    "duplicate_completions": "Repeated completions of already-ready blocks (ignored).",
    "resets": "Calls to reset_cache.",
}
_GAUGES = {
    "num_blocks": "Capacity in blocks.",
    "stored_blocks": "Blocks stored (ready or being written).",
    "pending_blocks": "Blocks being written.",
    "pinned_blocks": "Blocks being read.",
    "evictable_blocks": "Blocks that may be evicted now.",
    "held_blocks": "Slots of jobs in flight at a reset, not handed out until they complete.",
    "fill_ratio": "Stored blocks / capacity.",
    "pending_ratio": "Blocks being written / capacity.",
    "pinned_ratio": "Blocks being read / capacity.",
}


class ManagerCollector(Collector):
    """A Prometheus collector for one manager; labels distinguish several tiers or engines."""

    def __init__(
        self,
        manager: OffloadingManager,
        prefix: str = "kvoffload",
        labels: dict[str, str] | None = None,
    ) -> None:
        self.manager = manager
        self.prefix = prefix
        self.labels = dict(labels or {})

    def collect(self) -> Iterator[Any]:
        stats = self.manager.get_stats()
        if stats is None:
            return
        values = stats.as_dict()
        names = list(self.labels)
        label_values = [self.labels[n] for n in names]
        for name, doc in _COUNTERS.items():
            counter = CounterMetricFamily(f"{self.prefix}_{name}", doc, labels=names)
            counter.add_metric(label_values, float(values[name]))
            yield counter
        for name, doc in _GAUGES.items():
            gauge = GaugeMetricFamily(f"{self.prefix}_{name}", doc, labels=names)
            gauge.add_metric(label_values, float(values[name]))
            yield gauge
        for name, value in stats.policy.items():
            gauge = GaugeMetricFamily(
                f"{self.prefix}_policy_{name}", f"Policy gauge '{name}'.", labels=names
            )
            gauge.add_metric(label_values, float(value))
            yield gauge


def register_manager_metrics(
    manager: OffloadingManager,
    registry: CollectorRegistry | None = None,
    prefix: str = "kvoffload",
    labels: dict[str, str] | None = None,
) -> ManagerCollector:
    """Register a :class:`ManagerCollector` (on the default registry unless one is given)."""
    collector = ManagerCollector(manager, prefix, labels)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector


__all__ = ["ManagerCollector", "register_manager_metrics"]
