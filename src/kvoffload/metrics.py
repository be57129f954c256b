"""Prometheus exposition of managers' stats (needs the ``[metrics]`` extra).

The collector reads ``manager.get_stats()`` at scrape time, so the hot path pays nothing:
no counter is incremented twice. Counters are exported as Prometheus counters (``_total``),
occupancy as gauges, and the policy's own gauges (ARC's target, ghost sizes, ...) as
``<prefix>_policy_<name>``.

**Several managers, one registry.** Each metric family (``kvoffload_hits_total``, ...) is
exported once per registry and prefix; every registered manager is one labelled series in it.
The label set is the same for every member of a family, and its usual key is ``tier``
(``"cpu"``, ``"disk"``, ``"remote"``), optionally with others (``engine``, ``model``)::

    register_manager_metrics(cpu_manager, labels={"tier": "cpu"})
    register_manager_metrics(disk_manager, labels={"tier": "disk"})
    # kvoffload_hits_total{tier="cpu"} 12.0
    # kvoffload_hits_total{tier="disk"} 3.0

so a dashboard sums over ``tier`` or picks one. A second manager with the same label values,
or with other label names, is a :class:`ValueError` (Prometheus would see a duplicate or a
mixed series); one manager alone may go unlabelled. A tier that has gauges of its own adds
families under the same prefix with the same label set.

**A tiering manager** (:func:`register_tiering_metrics`) is its CPU tier as above
(``tier="cpu"``) plus one series per secondary tier in the ``<prefix>_tier_*`` families
(lookups, hits, bytes and seconds read and written, drops by ``reason``, evictions, corrupt
records, used and capacity bytes, breaker state, what each tier saved: tokens served, prefill
seconds saved, seconds loading and the net, blocks recomputed by choice, and latency
histograms ``<prefix>_tier_<lookup|load|promotion|store>_latency_seconds``, 0.1 ms to 10 s; the CPU
tier's own ``tier="cpu"`` series in these families come from the engine's CPU->device loads),
and its own counters in ``<prefix>_tiering_*``. Several tiering managers on one registry
(one per engine) are told apart by their ``labels`` (e.g. ``{"engine": "0"}``);
``docs/tiers.md`` maps the names to vLLM's ``vllm:kv_offload_tiering_*``.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvoffload.manager import OffloadingManager
    from kvoffload.tiers.manager import TieringManager

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
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
    "policy_switches": "Live replacements of the eviction policy (switch_policy).",
}
_GAUGES = {
    "num_blocks": "Capacity in blocks.",
    "stored_blocks": "Blocks stored (ready or being written).",
    "pending_blocks": "Blocks being written.",
    "pinned_blocks": "Blocks being read.",
    "evictable_blocks": "Blocks that may be evicted now.",
    "held_blocks": "Slots neither stored nor free: jobs in flight at a reset, write-backs.",
    "fill_ratio": "Stored blocks / capacity.",
    "pending_ratio": "Blocks being written / capacity.",
    "pinned_ratio": "Blocks being read / capacity.",
}
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9:]*[^a-zA-Z0-9_:][^a-zA-Z0-9:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


def _check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """A copy of ``labels`` after checking it is a Prometheus label set of strings."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise TypeError(f"labels: expected a mapping of str to str, got {type(labels).__name__}")
    for name, value in labels.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"labels: names and values must be str, got {name!r}: {value!r}")
        if not _LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(
                f"labels: {name!r} is not a Prometheus label name "
                "(letters, digits and '_', not starting with a digit or '__')"
            )
    return dict(labels)


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix: {prefix!r} is not a Prometheus metric name prefix")
    return prefix


#: A histogram's value: ``(cumulative buckets as (upper bound, count), sum)``.
_Histogram = tuple[list[tuple[str, int]], float]
#: ``(kind, family name, help, labels of this series only, value)``.
_Sample = tuple[str, str, str, dict[str, str], float | _Histogram]


class _Member(Collector):
    """One manager's figures, read at scrape time, and the labels naming its series."""

    def __init__(
        self, manager: Any, prefix: str = "kvoffload", labels: Mapping[str, str] | None = None
    ) -> None:
        self.manager = manager
        self.prefix = _check_prefix(prefix)
        self.labels = _check_labels(labels)

    def samples(self) -> Iterator[_Sample]:
        """``(kind, family name, help, labels of this series only, value)`` per figure."""
        raise NotImplementedError

    def collect(self) -> Iterator[Any]:
        return _families(sorted(self.labels), [self])


class ManagerCollector(_Member):
    """A Prometheus collector for one manager; ``labels`` name its series (e.g. its tier).

    Register it alone on a registry of its own, or (the usual way) through
    :func:`register_manager_metrics`, which puts several managers into one set of families.
    """

    manager: OffloadingManager

    def samples(self) -> Iterator[_Sample]:
        stats = self.manager.get_stats()
        if stats is None:
            return
        values = stats.as_dict()
        for name, doc in _COUNTERS.items():
            yield "counter", f"{self.prefix}_{name}", doc, {}, float(values[name])
        for name, doc in _GAUGES.items():
            yield "gauge", f"{self.prefix}_{name}", doc, {}, float(values[name])
        for name, value in stats.policy.items():
            # A gauge may name a policy with params ("shadow_mq(lifetime=50)_hit_ratio"):
            # each run of characters a metric name cannot hold (with the "_"s around it)
            # becomes one "_".
            metric = _NOT_IN_NAME.sub("_", name).strip("_")
            doc = f"Policy gauge '{name}'."
            yield "gauge", f"{self.prefix}_policy_{metric}", doc, {}, float(value)


_KINDS: dict[str, Any] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
    "histogram": HistogramMetricFamily,
}


def _families(label_names: list[str], members: Sequence[_Member]) -> Iterator[Any]:
    """One family per figure, with one sample per member (and extra labels), in order."""
    families: dict[str, Any] = {}
    for member in members:
        base = [member.labels[n] for n in label_names]
        for kind, name, doc, extra, value in member.samples():
            family = families.get(name)
            if family is None:
                cls = _KINDS[kind]
                family = families[name] = cls(name, doc, labels=[*label_names, *extra])
            if isinstance(value, tuple):  # a histogram
                buckets, total = value
                family.add_metric([*base, *extra.values()], buckets, total)
            else:
                family.add_metric([*base, *extra.values()], value)
    return iter(families.values())


class _Shared(Collector):
    """Every member of one kind registered on one registry under one prefix: one set of
    families, one label set, one series per member (see the module docstring)."""

    def __init__(
        self,
        prefix: str,
        what: str,
        hint: str,
        fixed: Callable[[str, list[str]], Iterator[Any]],
    ) -> None:
        self.prefix = prefix
        self.what = what  # "a manager", "a tiering manager": for the errors
        self.hint = hint  # how to tell two members apart
        self.fixed = fixed  # the families always exported (so a clash is found at register)
        self.label_names: list[str] | None = None
        self.members: list[_Member] = []
        self._lock = threading.Lock()

    def add(self, member: _Member) -> None:
        names = sorted(member.labels)
        with self._lock:
            if self.members and names != self.label_names:
                raise ValueError(
                    f"labels: {self.what}s under prefix {self.prefix!r} on one registry share "
                    f"one label set; this registry uses {self.label_names}, got {names}"
                )
            if any(other.labels == member.labels for other in self.members):
                hint = "" if names and self.what == "manager" else f" ({self.hint})"
                raise ValueError(
                    f"labels: {self.what} with labels {member.labels} is already registered "
                    f"under prefix {self.prefix!r}{hint}"
                )
            self.label_names = names
            self.members.append(member)

    def remove(self, member: _Member) -> bool:
        with self._lock:
            if member not in self.members:
                return False
            self.members.remove(member)
            return True

    def describe(self) -> Iterator[Any]:
        return self.fixed(self.prefix, list(self.label_names or ()))

    def collect(self) -> Iterator[Any]:
        with self._lock:
            members = list(self.members)
            names = list(self.label_names or ())
        return _families(names, members)


_SHARED: weakref.WeakKeyDictionary[CollectorRegistry, dict[tuple[str, str], _Shared]] = (
    weakref.WeakKeyDictionary()
)
_SHARED_LOCK = threading.Lock()


def _register(
    registry: CollectorRegistry | None, member: _Member, make: Callable[[], _Shared]
) -> None:
    """Add ``member`` to its kind's shared collector on ``registry`` (made on first use)."""
    registry = registry if registry is not None else REGISTRY
    slot = (type(member).__name__, member.prefix)
    with _SHARED_LOCK:
        per_registry = _SHARED.setdefault(registry, {})
        shared = per_registry.get(slot)
        if shared is None:
            shared = make()
            shared.add(member)
            registry.register(shared)  # may raise if another collector owns these names
            per_registry[slot] = shared
        else:
            shared.add(member)


def _unregister(registry: CollectorRegistry | None, member: _Member, what: str) -> None:
    registry = registry if registry is not None else REGISTRY
    slot = (type(member).__name__, member.prefix)
    with _SHARED_LOCK:
        shared = _SHARED.get(registry, {}).get(slot)
        if shared is None or not shared.remove(member):
            raise ValueError(f"{what}: not registered on this registry")
        if not shared.members:
            registry.unregister(shared)
            del _SHARED[registry][slot]


def _manager_families(prefix: str, names: list[str]) -> Iterator[Any]:
    for name, doc in _COUNTERS.items():
        yield CounterMetricFamily(f"{prefix}_{name}", doc, labels=names)
    for name, doc in _GAUGES.items():
        yield GaugeMetricFamily(f"{prefix}_{name}", doc, labels=names)


def register_manager_metrics(
    manager: OffloadingManager,
    registry: CollectorRegistry | None = None,
    prefix: str = "kvoffload",
    labels: Mapping[str, str] | None = None,
) -> ManagerCollector:
    """Export ``manager``'s stats on ``registry`` (the default registry unless one is given).

    Managers registered on the same registry and prefix share the families, one series each,
    told apart by ``labels`` (usually ``{"tier": ...}``). Returns the manager's collector;
    :func:`unregister_manager_metrics` removes it.
    """
    member = ManagerCollector(manager, prefix, labels)
    _register(
        registry,
        member,
        lambda: _Shared(
            member.prefix,
            "manager",
            'pass labels={"tier": ...} to tell them apart',
            _manager_families,
        ),
    )
    return member


def unregister_manager_metrics(
    collector: ManagerCollector, registry: CollectorRegistry | None = None
) -> None:
    """Stop exporting the manager behind ``collector`` (from :func:`register_manager_metrics`)."""
    _unregister(registry, collector, "collector")


# ------------------------------------------------------------------ tiering managers

#: ``<prefix>_tier_<name>`` counters: (stats key of ``TieringStats.tiers[label]``, help).
_TIER_COUNTERS = {
    "lookups": ("lookups", "Keys asked of this tier (CPU misses that reached it)."),
    "hits": ("hits", "Keys this tier had."),
    "promotions": ("promotions", "Blocks read from this tier into the CPU tier."),
    "promotion_failures": ("promotion_failures", "Reads from this tier that failed (a miss)."),
    "blocks_written": ("blocks_written", "Blocks written to this tier."),
    "write_failures": ("write_failures", "Blocks whose write to this tier failed."),
    "read_bytes": ("bytes_read", "Payload bytes read from this tier."),
    "write_bytes": ("bytes_written", "Payload bytes written to this tier."),
    "read_seconds": ("read_seconds", "Wall seconds of this tier's read jobs (summed)."),
    "write_seconds": ("write_seconds", "Wall seconds of this tier's write jobs (summed)."),
    "breaker_trips": ("breaker_trips", "Times this tier's circuit breaker opened."),
    "stale_completions": ("stale_completions", "Jobs that completed after a reset (ignored)."),
}
#: What each tier saved (the CPU tier's too): ``<prefix>_tier_<name>`` counters and gauges.
_BENEFIT_COUNTERS = {
    "tokens_served": ("tokens_served", "Prompt tokens this tier's blocks served (not prefilled)."),
    "prefill_seconds_saved": (
        "prefill_seconds_saved",
        "Estimated prefill seconds those tokens saved (at the measured marginal prefill cost).",
    ),
    "loading_seconds": ("load_seconds", "Seconds spent loading those blocks."),
    "blocks_recomputed_by_choice": (
        "blocks_recomputed_by_choice",
        "Hit blocks left to prefill because reading them was expected to be slower.",
    ),
    "probes": ("probes", "Reads made anyway to re-measure a tier judged slow."),
}
_BENEFIT_GAUGES = {
    "net_seconds_saved": ("net_seconds_saved", "Prefill seconds saved minus seconds loading."),
    "est_read_fixed_s": ("est_read_fixed_s", "Estimated seconds of one read job (latency)."),
    "est_read_bytes_per_s": ("est_read_bytes_per_s", "Estimated read bandwidth (bytes/s)."),
    "est_queue_seconds": ("est_queue_s", "Estimated wait of a read before its result is seen."),
}
_LATENCY_DOCS = {
    "lookup": "Seconds of this tier's presence checks (one call per lookup).",
    "load": "Seconds of this tier's read jobs (CPU tier: CPU->device loads).",
    "promotion": "Seconds from submitting a read to its result being seen (queue included).",
    "store": "Seconds of this tier's write jobs.",
}
_TIER_GAUGES = {
    "breaker_state": ("breaker_gauge", "Circuit breaker: 0 closed, 1 half-open, 2 open."),
    "jobs_in_flight": ("jobs_in_flight", "Jobs submitted to this tier and not yet polled."),
    "inflight_bytes": ("inflight_bytes", "Bytes of this tier's jobs in flight."),
    "write_back_blocks": (
        "write_back_blocks",
        "Evicted CPU blocks whose write to this tier is in flight (their slots held).",
    ),
}
#: Figures a tier's own ``stats()`` may report (``medium_*``), exported when it does.
_MEDIUM_GAUGES = {
    "used_bytes": "Bytes this tier stores now (records and their headers).",
    "capacity_bytes": "This tier's byte budget.",
    "records": "Records this tier stores now.",
}
#: ``<prefix>_tiering_<name>`` counters of the manager itself (no ``tier`` label).
_TIERING_COUNTERS = {
    "promotion_allocation_failures": "Promotions cut for lack of CPU room.",
    "retries": "Lookups answered RETRY while a tier's answer was unknown.",
    "resets": "Calls to reset_cache.",
    "reset_timeouts": "Resets whose tiers did not drain in time.",
    "stores_dropped_resetting": "Stores refused while a reset waited for the tiers.",
    "evicted_ahead": "CPU blocks evicted ahead of need so write-back tiers get them.",
    "write_back_waits": "Stores that waited for write-backs to free their CPU room.",
    "stores_waiting_write_back": "Stores refused while their room was being written back.",
}


def _medium_evictions(stats: Mapping[str, Any]) -> float:
    """Records the tier dropped for room: its own count when it keeps one, else ours."""
    return float(stats.get("medium_evictions", stats.get("tier_evictions", 0)))


def _medium_corrupt(stats: Mapping[str, Any]) -> float:
    """Records the tier found bad and dropped (its ``TierStats.bad_records``)."""
    return float(stats.get("medium_bad_records", 0))


class TieringCollector(_Member):
    """The secondary tiers of one :class:`~kvoffload.tiers.manager.TieringManager`.

    Register it with :func:`register_tiering_metrics` (which also exports the CPU tier).
    """

    manager: TieringManager

    def __init__(
        self,
        manager: TieringManager,
        prefix: str = "kvoffload",
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(manager, prefix, labels)
        if "tier" in self.labels or "reason" in self.labels:
            raise ValueError(
                "labels: 'tier' and 'reason' are set per series by the tiering metrics; "
                "name the manager with another label (e.g. engine)"
            )

    def samples(self) -> Iterator[_Sample]:
        stats = self.manager.get_stats()
        p = f"{self.prefix}_tier"
        # ``stats.tiers`` and ``manager.tiers`` list the secondaries in one order.
        for (label, tier), medium in zip(stats.tiers.items(), self.manager.tiers, strict=True):
            one = {"tier": label}
            # What the tier says of itself (a disk below its free-space floor, a Redis that
            # lost its connection), apart from the breaker, which only counts failed jobs.
            yield (
                "gauge",
                f"{p}_healthy",
                "1 while the tier says it can serve (Tier.health()), else 0.",
                one,
                float(medium.health().ok),
            )
            for name, (key, doc) in _TIER_COUNTERS.items():
                yield "counter", f"{p}_{name}", doc, one, float(tier.get(key, 0))
            yield (
                "counter",
                f"{p}_evictions",
                "Records this tier evicted for room.",
                one,
                (_medium_evictions(tier)),
            )
            yield (
                "counter",
                f"{p}_corrupt_records",
                ("Records found corrupt, torn or forged and dropped (never served)."),
                one,
                _medium_corrupt(tier),
            )
            for reason, count in sorted(tier.get("drops", {}).items()):
                yield (
                    "counter",
                    f"{p}_dropped_blocks",
                    ("Blocks not written to this tier, by reason."),
                    {"tier": label, "reason": reason},
                    float(count),
                )
            for name, (key, doc) in _TIER_GAUGES.items():
                yield "gauge", f"{p}_{name}", doc, one, float(tier.get(key, 0))
            for name, doc in _MEDIUM_GAUGES.items():
                value = tier.get(f"medium_{name}")
                if value is not None:
                    yield "gauge", f"{p}_{name}", doc, one, float(value)
        cpu = {k[4:]: v for k, v in stats.tiering.items() if k.startswith("cpu_")}
        for label, tier in [*stats.tiers.items(), ("cpu", cpu)]:
            one = {"tier": label}
            for name, (key, doc) in _BENEFIT_COUNTERS.items():
                yield "counter", f"{p}_{name}", doc, one, float(tier.get(key, 0))
            for name, (key, doc) in _BENEFIT_GAUGES.items():
                yield "gauge", f"{p}_{name}", doc, one, float(tier.get(key, 0))
        for label, histograms in self.manager.latency_histograms().items():
            for kind, hist in histograms.items():
                yield (
                    "histogram",
                    f"{p}_{kind}_latency_seconds",
                    _LATENCY_DOCS[kind],
                    {"tier": label},
                    (hist.cumulative(), hist.sum),
                )
        for name in ("decide", "prefill_tokens_per_s"):
            doc = (
                "1 while the load-or-recompute decision is on."
                if name == "decide"
                else "The engine's estimated prefill speed (tokens/s)."
            )
            yield "gauge", f"{self.prefix}_tiering_{name}", doc, {}, float(stats.tiering[name])
        for name, doc in _TIERING_COUNTERS.items():
            value = stats.tiering.get(name, 0)
            yield "counter", f"{self.prefix}_tiering_{name}", doc, {}, float(value)


def _tiering_families(prefix: str, names: list[str]) -> Iterator[Any]:
    for name in (*_TIER_COUNTERS, *_BENEFIT_COUNTERS, "evictions", "corrupt_records"):
        yield CounterMetricFamily(f"{prefix}_tier_{name}", "", labels=[*names, "tier"])
    for name in _TIERING_COUNTERS:
        yield CounterMetricFamily(f"{prefix}_tiering_{name}", "", labels=names)


def register_tiering_metrics(
    manager: TieringManager,
    registry: CollectorRegistry | None = None,
    prefix: str = "kvoffload",
    labels: Mapping[str, str] | None = None,
) -> tuple[ManagerCollector, TieringCollector]:
    """Export a tiering manager: its CPU tier (``tier="cpu"``) and every secondary tier.

    ``labels`` name the manager (``{"engine": "0"}``) when several share ``registry``; the
    ``tier`` label is set per series. Returns both collectors for
    :func:`unregister_tiering_metrics`.
    """
    member = TieringCollector(manager, prefix, labels)
    registry = registry if registry is not None else REGISTRY
    cpu = register_manager_metrics(manager, registry, prefix, {**member.labels, "tier": "cpu"})
    try:
        _register(
            registry,
            member,
            lambda: _Shared(
                member.prefix,
                "tiering manager",
                "pass labels={'engine': ...}",
                _tiering_families,
            ),
        )
    except BaseException:
        unregister_manager_metrics(cpu, registry)
        raise
    return cpu, member


def unregister_tiering_metrics(
    collectors: tuple[ManagerCollector, TieringCollector],
    registry: CollectorRegistry | None = None,
) -> None:
    """Stop exporting a tiering manager (what :func:`register_tiering_metrics` returned)."""
    cpu, member = collectors
    _unregister(registry, member, "collectors")
    unregister_manager_metrics(cpu, registry)


__all__ = [
    "ManagerCollector",
    "TieringCollector",
    "register_manager_metrics",
    "register_tiering_metrics",
    "unregister_manager_metrics",
    "unregister_tiering_metrics",
]
