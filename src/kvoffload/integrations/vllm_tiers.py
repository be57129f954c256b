"""kvoffload's tiers inside vLLM's own tiering manager, by configuration alone.

vLLM 0.33 and 0.34 cascade KV from the CPU tier to secondary tiers and load an out-of-tree tier by
``type`` (a class name) plus ``module_path``, the way it loads our policies. This module holds
those classes: each wraps one of our :class:`~kvoffload.tiers.Tier` s behind vLLM's
``SecondaryTierManager`` contract::

    "secondary_tiers": [{"type": "KVOffloadDiskTier",
                         "module_path": "kvoffload.integrations.vllm_tiers",
                         "root_dir": "/nvme/kv", "capacity_bytes": 500 * 2**30},
                        {"type": "KVOffloadRedisTier",
                         "module_path": "kvoffload.integrations.vllm_tiers",
                         "url": "redis://user:password@host:6379/0"}]

Mapping of the contract (vLLM's words on the left):

* ``lookup(key)`` -> ``Tier.contains``: HIT / MISS, and RETRY only while a remote check is in
  flight; our tier turns an unanswered check into a MISS at its deadline, so a slow or broken
  server never keeps a request in RETRY (vLLM #45765).
* ``submit_store`` / ``submit_load`` -> ``Tier.submit_put`` / ``submit_get`` on vLLM's primary
  chunk ids, read from and written into vLLM's primary memory view (no copy of our own).
* ``get_finished_jobs`` -> ``Tier.poll``: each job exactly once; a partly failed promotion
  names its successful keys, so vLLM keeps those and frees the rest. vLLM 0.34's
  ``JobResult.deferred_release`` is left ``None``: our tier reports a job only once its copies
  into vLLM's slots are over, so the slots of a failed promotion are free at once. A key whose
  load failed is a MISS for ``failed_load_ttl_s`` even if the medium still lists it (a
  transient read error), so vLLM never promotes it again and again (the livelock of vLLM
  #49176).
* ``drain_jobs`` -> ``Tier.drain`` in bounded rounds (in-flight copies are never aborted).
* ``take_events`` -> vLLM ``OffloadingEvent`` s for stored and evicted records, only when
  vLLM's KV events are on and the tier's ``enable_kv_events`` is set (as for vLLM's fs tier:
  otherwise nobody drains them).
* ``build_metric_definitions`` / ``get_stats`` -> our tier's counters and gauges as
  ``vllm:kv_offload_kvoffload_<disk|redis>_*`` metrics (label ``store``; never ``tier``, which
  vLLM adds itself), counters as increments since the previous call, as vLLM expects.
  vLLM's manager already counts bytes, times, queries and hits per tier from our job
  results (``vllm:kv_offload_tiering_*``), so those are not repeated.

Importing this module needs vLLM; our tiers do not.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvoffload.keys import OffloadKey, namespace_fingerprint
from kvoffload.tiers.base import (
    STAT_GAUGES,
    JobKind,
    MemoryviewSlotMemory,
    Presence,
    Tier,
    TierResult,
    TierStats,
    check_seconds,
)

logger = logging.getLogger(__name__)

__all__ = [
    "KVOffloadDiskTier",
    "KVOffloadRedisTier",
    "PrimaryViewSlots",
    "TierMetric",
    "check_tier_config",
]


class PrimaryViewSlots(MemoryviewSlotMemory):
    """vLLM's primary memory view (``(num_chunks, row_stride)`` bytes) as our ``SlotMemory``.

    ``release()`` drops our export of vLLM's buffer, so vLLM can unmap it at shutdown.
    """

    def __init__(self, view: memoryview) -> None:
        if view.ndim != 2 or not view.c_contiguous:
            raise ValueError(
                "vLLM's primary view must be a C-contiguous (num_chunks, row_bytes) memoryview, "
                f"got ndim={view.ndim}, c_contiguous={view.c_contiguous}"
            )
        super().__init__(view, view.strides[0] if view.strides else 0)


def check_tier_config(
    tier_cls: type, config: dict[str, Any], *, owner: str, extra: Iterable[str] = ()
) -> None:
    """Reject keys ``tier_cls`` does not accept, with a did-you-mean (vLLM passes them as-is).

    ``extra`` adds names the adapter itself takes (vLLM-style aliases, its own keys).
    """
    params = inspect.signature(tier_cls.__init__).parameters
    accepted = [*extra] + [
        n
        for n, p in params.items()
        if n not in ("self", "memory") and (p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
    ]
    for key in config:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{owner}: unknown config key {key!r}{hint} (accepted: {', '.join(accepted)})"
            )


@dataclass(frozen=True)
class TierMetric:
    """One of our tier's ``stats()`` entries as a vLLM metric.

    ``stat`` is the stats key, or a prefix ending in ``_`` whose keys (``dropped_no_space``,
    ...) become one metric with a ``reason`` label. Counters are reported as the increase
    since the previous ``get_stats`` (vLLM sums them); gauges as the current value.
    """

    stat: str
    suffix: str
    kind: str  # "counter" or "gauge"
    documentation: str

    @property
    def by_reason(self) -> bool:
        return self.stat.endswith("_")


#: Most keys remembered as "last load failed" (each a MISS until its ``failed_load_ttl_s``).
_MAX_FAILED_LOADS = 65536

#: The label our metrics carry to tell two tiers of one kind apart (vLLM adds ``tier``).
STORE_LABEL = "store"


class _KVOffloadSecondaryTier(SecondaryTierManager):
    """Common adapter: one of our tiers behind vLLM's ``SecondaryTierManager``."""

    #: Our tier class, built with the primary view and the tier's own config keys.
    tier_class: ClassVar[type[Tier]]
    #: ``disk`` / ``redis``: the middle of our metric names.
    metric_kind: ClassVar[str] = "tier"
    #: Our stats that become vLLM metrics.
    metrics: ClassVar[tuple[TierMetric, ...]] = ()
    #: Keys of vLLM's tier config that belong to the adapter (not passed to our tier).
    _ADAPTER_KEYS: ClassVar[frozenset[str]] = frozenset(
        {"locality", "enable_kv_events", "failed_load_ttl_s"}
    )
    #: vLLM-style aliases of our tier's parameters (vLLM's name -> ours).
    _ALIASES: ClassVar[dict[str, str]] = {}
    #: vLLM's ``locality`` when the config gives none (the config's ``locality`` wins, as
    #: for vLLM's fs tier: where a path or a server lies is the operator's to say).
    default_locality: ClassVar[Locality | None] = None
    drain_round_s: ClassVar[float] = 30.0

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **config: Any,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        enable_kv_events = config.get("enable_kv_events", False)
        if not isinstance(enable_kv_events, bool):
            raise TypeError(
                f"{type(self).__name__}: enable_kv_events must be a bool, "
                f"got {type(enable_kv_events).__name__}"
            )
        events_cfg = getattr(offloading_spec, "kv_events_config", None)
        # vLLM drains take_events() only when its KV events are on: collect nothing otherwise
        self._emit_events = enable_kv_events and bool(
            getattr(events_cfg, "enable_kv_cache_events", False)
        )
        locality = config.get("locality")
        self.locality = Locality(locality) if locality is not None else self.default_locality
        ttl = config.get("failed_load_ttl_s", 5.0)
        ttl = check_seconds(f"{type(self).__name__}: failed_load_ttl_s", ttl)
        self.failed_load_ttl_s = float(ttl)
        ours = {k: v for k, v in config.items() if k not in self._ADAPTER_KEYS}
        check_tier_config(
            self.tier_class,
            ours,
            owner=type(self).__name__,
            extra=[*self._ALIASES, *sorted(self._ADAPTER_KEYS - {"locality"})],
        )
        ours = self._translate(self._unalias(ours), offloading_spec)
        self.tier: Tier = self.tier_class(PrimaryViewSlots(primary_kv_view), **ours)
        self._jobs: dict[int, tuple[int, TransferJob]] = {}  # our job id -> (vLLM id, job)
        self._events: list[OffloadingEvent] = []
        self._failed_loads: dict[OffloadKey, float] = {}  # key -> monotonic expiry
        self._reported: dict[tuple[str, str], float] = {}  # counters as last reported

    @classmethod
    def _unalias(cls, config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        given: dict[str, str] = {}
        for key, value in config.items():
            ours = cls._ALIASES.get(key, key)
            if ours in out:
                raise ValueError(
                    f"{cls.__name__}: {given[ours]!r} and {key!r} name the same setting; give one"
                )
            out[ours] = value
            given[ours] = key
        return out

    def _translate(self, config: dict[str, Any], spec: Any) -> dict[str, Any]:
        """vLLM-style keys -> our tier's parameters (subclasses add defaults)."""
        return config

    @staticmethod
    def default_namespace(spec: Any) -> bytes:
        """Blocks are shared only between engines of one model, dtype and block geometry."""
        cfg = getattr(spec, "config", None)
        if cfg is None:
            return namespace_fingerprint(engine="vllm")
        return namespace_fingerprint(
            engine="vllm",
            model=cfg.model.name,
            dtype=cfg.model.dtype,
            tokens_per_hash=cfg.cache.tokens_per_hash,
            blocks_per_chunk=cfg.cache.blocks_per_chunk,
            bytes_per_block=cfg.worker_kv_bytes_per_block,
            tp=1 if cfg.parallel.is_parallelism_agnostic else cfg.parallel.tp_size,
            pp=1 if cfg.parallel.is_parallelism_agnostic else cfg.parallel.pp_size,
            rank=0 if cfg.parallel.is_parallelism_agnostic else cfg.parallel.rank,
            layout=cfg.kv_cache_layout,
        )

    # -- vLLM's contract ----------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._failed_loads:
            expiry = self._failed_loads.get(key)
            if expiry is not None:
                if time.monotonic() < expiry:
                    return LookupResult.MISS  # its last load failed: do not promote it again
                del self._failed_loads[key]
        presence = self.tier.contains([key])[0]
        if presence is Presence.HIT:
            return LookupResult.HIT
        if presence is Presence.UNKNOWN:
            return LookupResult.RETRY
        return LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        slots = [int(c) for c in job_metadata.chunk_ids]
        ours = self.tier.submit_put(keys, slots)
        self._jobs[ours] = (job_metadata.job_id, job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        slots = [int(c) for c in job_metadata.chunk_ids]
        ours = self.tier.submit_get(keys, slots)
        self._jobs[ours] = (job_metadata.job_id, job_metadata)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out: list[JobResult] = []
        for result in self.tier.poll():
            entry = self._jobs.pop(result.job_id, None)
            if entry is None:  # a delete or a job of ours vLLM never saw
                continue
            vllm_id, job = entry
            out.append(self._job_result(vllm_id, job, result))
        return out

    def _job_result(self, vllm_id: int, job: TransferJob, result: TierResult) -> JobResult:
        ok_keys = [k for k, ok in zip(result.keys, result.ok, strict=True) if ok]
        if result.kind is JobKind.GET and not result.all_ok and self.failed_load_ttl_s > 0:
            now = time.monotonic()
            for key, ok in zip(result.keys, result.ok, strict=True):
                if not ok:
                    self._failed_loads.pop(key, None)  # re-insert: the dict stays expiry-ordered
                    self._failed_loads[key] = now + self.failed_load_ttl_s
            self._prune_failed_loads(now)
        if self._emit_events:
            self._add_events(result, ok_keys)
        successful: Collection[OffloadKey] | None = None
        if job.is_promotion and not result.all_ok:
            successful = ok_keys
        return JobResult(
            job_id=vllm_id,
            success=result.all_ok,
            successful_keys=successful,
            transfer_time=result.seconds,
            transfer_bytes=result.nbytes,
        )

    def _prune_failed_loads(self, now: float) -> None:
        """Drop expired verdicts (oldest first) and keep at most ``_MAX_FAILED_LOADS``."""
        failed = self._failed_loads
        while failed:
            key, expiry = next(iter(failed.items()))
            if expiry > now and len(failed) <= _MAX_FAILED_LOADS:
                break
            del failed[key]

    def _add_events(self, result: TierResult, ok_keys: list[OffloadKey]) -> None:
        medium = self.medium or Medium.STORAGE
        if result.kind is JobKind.PUT and ok_keys:
            self._events.append(
                OffloadingEvent(
                    keys=ok_keys,
                    medium=medium,
                    removed=False,
                    locality=self.locality,
                    ownership=self.tier_type,
                )
            )
        if result.evicted:
            self._events.append(
                OffloadingEvent(
                    keys=list(result.evicted),
                    medium=medium,
                    removed=True,
                    locality=self.locality,
                    ownership=self.tier_type,
                )
            )

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self._events = self._events, []
        return events

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        """Wait for every job (vLLM requires it before freeing primary slots).

        Waits in bounded rounds and logs each round that ends with jobs left, naming the tier,
        so a stuck medium is visible instead of a silent hang; copies in flight are never
        aborted (that would corrupt a primary slot).
        """
        started = time.monotonic()
        while not self.tier.drain(self.drain_round_s):
            logger.error(
                "%s: %d job(s) still in flight after %.0f s of drain_jobs (health: %s)",
                type(self).__name__,
                len(self._jobs),
                time.monotonic() - started,
                self.tier.health(),
            )

    # -- metrics ------------------------------------------------------------------------

    @classmethod
    def metric_name(cls, metric: TierMetric) -> str:
        return f"vllm:kv_offload_kvoffload_{cls.metric_kind}_{metric.suffix}"

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        out: dict[str, OffloadingMetricMetadata] = {}
        for metric in cls.metrics:
            labels = (STORE_LABEL, "reason") if metric.by_reason else (STORE_LABEL,)
            meta_cls = (
                OffloadingCounterMetadata if metric.kind == "counter" else (OffloadingGaugeMetadata)
            )
            out[cls.metric_name(metric)] = meta_cls(
                documentation=metric.documentation, labelnames=labels
            )
        return out

    def store_label(self) -> str:
        """Tells two tiers of one kind apart in metrics (a path, a server; no secrets)."""
        return self.tier_type

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Our tier's counters (increase since the last call) and gauges, as vLLM metrics."""
        stats = self.tier.tier_stats().as_dict()
        out = OffloadingConnectorStats()
        store = self.store_label()
        for metric in self.metrics:
            name = self.metric_name(metric)
            if metric.by_reason:
                found = [  # a common name (failed_keys) is never one of the reasons
                    (k[len(metric.stat) :], v)
                    for k, v in stats.items()
                    if k.startswith(metric.stat) and k not in _STAT_NAMES
                ]
            else:
                found = [("", stats[metric.stat])] if metric.stat in stats else []
            for reason, value in found:
                labels = (store, reason) if metric.by_reason else (store,)
                if metric.kind == "gauge":
                    out.set_gauge(name, float(value), labels)
                    continue
                last = self._reported.get((name, reason), 0.0)
                if value > last:
                    out.increase_counter(name, float(value) - last, labels)
                self._reported[(name, reason)] = float(value)
        return None if out.is_empty() else out

    def shutdown(self) -> None:
        self.tier.close()
        memory = self.tier.memory
        if isinstance(memory, PrimaryViewSlots):
            try:
                memory.release()
            except BufferError:  # a view is still held somewhere: vLLM keeps the map
                logger.warning("%s: vLLM's primary buffer is still in use", type(self).__name__)


def _disk_tier_class() -> type[Tier]:
    from kvoffload.tiers.disk import DiskTier

    return DiskTier


#: Metric suffixes kept from before the one stats schema, so dashboards keep their series.
_SUFFIXES = {"stored": "records_written", "jobs_in_flight": "inflight_jobs"}

_STAT_NAMES = frozenset(TierStats.names())

#: Every tier's common figures (``TierStats``), one metric each; a tier adds its extras.
_COMMON_METRICS = tuple(
    TierMetric(
        name,
        _SUFFIXES.get(name, name),
        "gauge" if name in STAT_GAUGES else "counter",
        TierStats.documentation(name),
    )
    for name in TierStats.names()
)


class KVOffloadDiskTier(_KVOffloadSecondaryTier):
    """Our bounded, checksummed, restartable disk tier as a vLLM secondary tier (STORAGE).

    Config keys follow vLLM's fs tier where they overlap: ``root_dir`` (our ``path``),
    ``capacity_bytes`` (required: the tier never holds more), ``eviction_policy`` (our
    ``policy``: any kvoffload policy name, default ``lru``) and ``cache_policy_module_path``
    (``policy_module_path``). Every other :class:`~kvoffload.tiers.disk.DiskTier` parameter
    is accepted by its name (``durability``, ``min_free_bytes``, ``io_threads``, ``put_lanes``,
    ``checksum``, ``verify_on_scan``, ``save_policy_state``, ``policy_params``, ``namespace``);
    ``namespace`` defaults to a fingerprint of vLLM's model, dtype, block geometry and (unless
    the layout is parallelism-agnostic) TP/PP rank, so engines of other models never read
    these records.
    Adapter keys: ``enable_kv_events`` (vLLM's, default False), ``failed_load_ttl_s``.
    """

    medium: ClassVar[Medium | None] = Medium.STORAGE
    tier_class: ClassVar[type[Tier]] = _disk_tier_class()
    metric_kind: ClassVar[str] = "disk"
    _ALIASES: ClassVar[dict[str, str]] = {
        "root_dir": "path",
        "eviction_policy": "policy",
        "cache_policy_module_path": "policy_module_path",
    }
    metrics: ClassVar[tuple[TierMetric, ...]] = (
        *_COMMON_METRICS,
        TierMetric(
            "effective_capacity_bytes",
            "effective_capacity_bytes",
            "gauge",
            "The budget after the free-space floor (min_free_bytes).",
        ),
        TierMetric(
            "corrupt_records",
            "corrupt_records",
            "counter",
            "Records whose checksum, key or namespace did not match on read "
            "(served as a miss and erased).",
        ),
        TierMetric(
            "torn_records",
            "torn_records",
            "counter",
            "Torn or foreign records found and erased by the start-up scan.",
        ),
        TierMetric(
            "scanned_records",
            "restart_records",
            "counter",
            "Records found by the start-up scan (served after a restart).",
        ),
        TierMetric("erase_errors", "erase_errors", "counter", "Failed erasures of records."),
        TierMetric(
            "dropped_",
            "stores_dropped",
            "counter",
            "Records not stored, by reason (no_space, io_error, in_flight, ...).",
        ),
        TierMetric(
            "get_failed_",
            "loads_failed",
            "counter",
            "Records not loaded, by reason (missing, corrupt, io_error, ...).",
        ),
    )

    def _translate(self, config: dict[str, Any], spec: Any) -> dict[str, Any]:
        config = dict(config)
        missing = [
            k
            for k, ours in (("root_dir", "path"), ("capacity_bytes", "capacity_bytes"))
            if ours not in config
        ]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: missing config key(s) {', '.join(map(repr, missing))} "
                "(root_dir: the directory; capacity_bytes: the most bytes the tier may use)"
            )
        config.setdefault("namespace", self.default_namespace(spec))
        policy = config.get("policy", "lru")
        self._info = {
            "kvoffload_capacity_bytes": config["capacity_bytes"],
            "kvoffload_eviction_policy": policy if isinstance(policy, str) else repr(policy),
            "kvoffload_durability": str(config.get("durability", "rename")),
        }
        self._root = os.fspath(config["path"])
        return config

    def store_label(self) -> str:
        return self._root

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("kvoffload_capacity_bytes", "kvoffload_eviction_policy", "kvoffload_durability")

    def config_info(self) -> ConfigInfoMapping:
        return dict(self._info)


def _redis_tier_class() -> type[Tier]:
    from kvoffload.tiers.redis import RedisTier

    return RedisTier


class KVOffloadRedisTier(_KVOffloadSecondaryTier):
    """Our shared Redis / Valkey tier (``kvoffload[redis]``) as a vLLM secondary tier.

    Config keys are :class:`~kvoffload.tiers.redis.RedisTier`'s (``url``, ``secret``,
    ``ttl_ms``, ``cluster``, ...); ``namespace`` defaults to a fingerprint of vLLM's model,
    dtype, block geometry and (unless the layout is parallelism-agnostic) TP/PP rank.
    """

    medium: ClassVar[Medium | None] = None  # neither host nor local disk: "external"
    default_locality: ClassVar[Locality | None] = Locality.REMOTE
    tier_class: ClassVar[type[Tier]] = _redis_tier_class()
    metric_kind: ClassVar[str] = "redis"
    metrics: ClassVar[tuple[TierMetric, ...]] = (
        *_COMMON_METRICS,
        TierMetric("inflight_bytes", "inflight_bytes", "gauge", "Bytes of jobs in flight."),
        TierMetric(
            "available",
            "available",
            "gauge",
            "1 while the server is reachable, 0 while the tier backs off.",
        ),
        TierMetric(
            "verdict_cache_entries",
            "verdict_cache_entries",
            "gauge",
            "Cached answers to existence checks.",
        ),
        TierMetric(
            "records_existing",
            "records_existing",
            "counter",
            "Stores skipped: the record was already on the server.",
        ),
        TierMetric(
            "records_deleted_bad",
            "records_deleted_bad",
            "counter",
            "Records no reader could accept (damaged, or of another namespace or key), deleted.",
        ),
        TierMetric(
            "connection_errors",
            "connection_errors",
            "counter",
            "Failed server operations (each starts a back-off).",
        ),
        TierMetric("lookup_errors", "lookup_errors", "counter", "Failed existence checks."),
        TierMetric(
            "rejected_",
            "records_rejected",
            "counter",
            "Records read and rejected, by reason (checksum, namespace, ...).",
        ),
        TierMetric("failed_", "keys_failed", "counter", "Keys of jobs that failed, by reason."),
    )

    def _translate(self, config: dict[str, Any], spec: Any) -> dict[str, Any]:
        config = dict(config)
        config.setdefault("namespace", self.default_namespace(spec))
        url = config.get("url", "redis://127.0.0.1:6379/0")
        self._server = _server_of(url) if isinstance(url, str) else self.tier_type
        return config

    def store_label(self) -> str:
        return self._server


def _server_of(url: str) -> str:
    """``scheme://host:port/db`` of a Redis URL, without its user name or password."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
