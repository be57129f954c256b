"""kvoffload's tiers inside vLLM's own tiering manager, by configuration alone.

vLLM 0.33 cascades KV from its CPU tier to secondary tiers and loads an out-of-tree tier by
``type`` (a class name) plus ``module_path``, the way it loads our policies. This module holds
those classes: each wraps one of our :class:`~kvoffload.tiers.Tier` s behind vLLM's
``SecondaryTierManager`` contract::

    "secondary_tiers": [{"type": "KVOffloadRedisTier",
                         "module_path": "kvoffload.integrations.vllm_tiers",
                         "url": "redis://user:password@host:6379/0"}]

Mapping of the contract (vLLM's words on the left):

* ``lookup(key)`` -> ``Tier.contains``: HIT / MISS, and RETRY only while a remote check is in
  flight; our tier turns an unanswered check into a MISS at its deadline, so a slow or broken
  server never keeps a request in RETRY (vLLM #45765).
* ``submit_store`` / ``submit_load`` -> ``Tier.submit_put`` / ``submit_get`` on vLLM's primary
  chunk ids, read from and written into vLLM's primary memory view (no copy of our own).
* ``get_finished_jobs`` -> ``Tier.poll``: each job exactly once; a partly failed promotion
  names its successful keys, so vLLM keeps those and frees the rest (a failed key is a miss
  for the next lookup, never a livelock: vLLM #49176).
* ``drain_jobs`` -> ``Tier.drain`` in bounded rounds (in-flight copies are never aborted).
* ``take_events`` -> vLLM ``OffloadingEvent`` s for stored and evicted records;
  ``get_stats`` -> the tier's counters under vLLM's tiering metric names.

Importing this module needs vLLM; our tiers do not.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import time
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvoffload.keys import OffloadKey, namespace_fingerprint
from kvoffload.tiers.base import JobKind, Presence, Tier, TierResult

logger = logging.getLogger(__name__)

__all__ = ["KVOffloadRedisTier", "PrimaryViewSlots", "check_tier_config"]


class PrimaryViewSlots:
    """vLLM's primary memory view (``(num_chunks, row_stride)`` bytes) as our ``SlotMemory``."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim != 2 or not view.c_contiguous:
            raise ValueError(
                "vLLM's primary view must be a C-contiguous (num_chunks, row_bytes) memoryview, "
                f"got ndim={view.ndim}, c_contiguous={view.c_contiguous}"
            )
        self._num_slots = view.shape[0] if view.shape else 0
        self._slot_bytes = view.strides[0] if view.strides else 0
        self._flat = view.cast("B")

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def slot_view(self, slot: int) -> memoryview:
        if not 0 <= slot < self._num_slots:
            raise ValueError(f"chunk id must be in [0, {self._num_slots}), got {slot}")
        start = slot * self._slot_bytes
        return self._flat[start : start + self._slot_bytes]


def check_tier_config(tier_cls: type, config: dict[str, Any], *, owner: str) -> None:
    """Reject keys ``tier_cls`` does not accept, with a did-you-mean (vLLM passes them as-is)."""
    params = inspect.signature(tier_cls.__init__).parameters
    accepted = [n for n, p in params.items() if n not in ("self", "memory") and p.kind in (
        p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for key in config:
        if key not in accepted:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"{owner}: unknown config key {key!r}{hint} (accepted: {', '.join(accepted)})"
            )


class _KVOffloadSecondaryTier(SecondaryTierManager):
    """Common adapter: one of our tiers behind vLLM's ``SecondaryTierManager``."""

    #: Our tier class, built with the primary view and the tier's own config keys.
    tier_class: ClassVar[type[Tier]]
    #: Keys of vLLM's tier config that belong to vLLM (not passed to our tier).
    _VLLM_KEYS: ClassVar[frozenset[str]] = frozenset({"locality"})
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
        ours = {k: v for k, v in config.items() if k not in self._VLLM_KEYS}
        ours = self._translate(ours, offloading_spec)
        check_tier_config(self.tier_class, ours, owner=type(self).__name__)
        self.tier: Tier = self.tier_class(PrimaryViewSlots(primary_kv_view), **ours)
        self._jobs: dict[int, tuple[int, TransferJob]] = {}  # our job id -> (vLLM id, job)
        self._events: list[OffloadingEvent] = []
        self._counters: dict[str, float] = {}

    def _translate(self, config: dict[str, Any], spec: Any) -> dict[str, Any]:
        """vLLM-style keys -> our tier's parameters (subclasses add aliases and defaults)."""
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
        self._count(result)
        if result.kind is JobKind.PUT and ok_keys:
            self._events.append(
                OffloadingEvent(keys=ok_keys, medium=self.medium or Medium.STORAGE,
                                removed=False, locality=self.locality, ownership=self.tier_type)
            )
        if result.evicted:
            self._events.append(
                OffloadingEvent(keys=list(result.evicted), medium=self.medium or Medium.STORAGE,
                                removed=True, locality=self.locality, ownership=self.tier_type)
            )
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

    def _count(self, result: TierResult) -> None:
        c = self._counters
        prefix = "write" if result.kind is JobKind.PUT else "read"
        c[f"{prefix}_bytes"] = c.get(f"{prefix}_bytes", 0.0) + result.nbytes
        c[f"{prefix}_time"] = c.get(f"{prefix}_time", 0.0) + result.seconds
        if not result.all_ok:
            put = result.kind is JobKind.PUT
            name = "cascade_job_failures" if put else "promotion_job_failures"
            c[name] = c.get(name, 0.0) + 1

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
                type(self).__name__, len(self._jobs), time.monotonic() - started,
                self.tier.health(),
            )

    def get_stats(self) -> dict[str, float]:
        """Our tier's counters plus vLLM-named totals (``write_bytes``, ``read_time``, ...)."""
        out = {f"kvoffload_{k}": v for k, v in self.tier.stats().items()}
        out.update(self._counters)
        return out

    def shutdown(self) -> None:
        self.tier.close()


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
    tier_class: ClassVar[type[Tier]] = _redis_tier_class()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.locality = Locality.REMOTE

    def _translate(self, config: dict[str, Any], spec: Any) -> dict[str, Any]:
        config = dict(config)
        config.setdefault("namespace", self.default_namespace(spec))
        return config
