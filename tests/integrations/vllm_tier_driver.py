"""Drives vLLM's own ``TieringOffloadingManager`` the way its scheduler does, moving real bytes.

Each request: vLLM's connector lookup (``_maximal_prefix_lookup``: the prompt's keys until a
MISS; while any is ``HIT_PENDING`` or ``RETRY`` the request waits a step and asks again from
the start, bounded), a load of the hit prefix whose bytes are checked, and
a store of the rest whose bytes are written into vLLM's primary view (as the GPU->CPU copy
would), then cascaded by vLLM to the secondary tiers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvoffload.context import ReqContext as OurReqContext
from kvoffload.manager import LookupResult as OurLookupResult

MODULE = "kvoffload.integrations.vllm_tiers"
_STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def block_pattern(key: bytes, size: int) -> bytes:
    seed = key * (size // max(1, len(key)) + 1)
    return bytes(seed[:size])


def tiering_spec(
    secondary_tiers: list[dict[str, Any]],
    num_chunks: int,
    block_bytes: int = 4096,
    engine_id: str = "kvoffload-test",
    eviction_policy: str = "lru",
    cache_policy_module_path: str | None = None,
    kv_events: bool = False,
) -> TieringOffloadingSpec:
    extra: dict[str, Any] = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": num_chunks * block_bytes,
        "eviction_policy": eviction_policy,
        "secondary_tiers": secondary_tiers,
        "tier_poll_interval_s": 0,
    }
    if cache_policy_module_path is not None:
        extra["cache_policy_module_path"] = cache_policy_module_path
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=kv_events,
        extra_config=extra,
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    return TieringOffloadingSpec(config)


@dataclass
class ReplayCounts:
    requests: int = 0
    block_accesses: int = 0
    prefix_hits: int = 0
    stored: int = 0
    loaded_bytes: int = 0
    bad_bytes: int = 0
    waits: int = 0
    #: keys HIT in one lookup pass and not HIT in the next pass of the same request (the
    #: request's own promotions evicted them from the CPU tier before it loaded them)
    lost_between_passes: int = 0
    gave_up: int = 0  # requests still deferred after max_wait_steps (treated as misses)
    by_source: dict[str, int] = field(default_factory=dict)


class VllmTieringDriver:
    lookup_result: Any = LookupResult

    def __init__(
        self, spec: TieringOffloadingSpec, max_wait_steps: int = 200, wait_on_tiers_s: float = 0.2
    ) -> None:
        self.spec = spec
        self.manager: Any = spec.get_manager()
        view = self.manager.primary_tier.get_kv_memoryview()
        self.block_bytes = view.strides[0]
        self.flat = view.cast("B")
        self.max_wait_steps = max_wait_steps
        #: how long a step waits for our tiers' jobs (0: nap instead; for RETRY/timeout tests)
        self.wait_on_tiers_s = wait_on_tiers_s
        self.counts = ReplayCounts()
        self._next = 0
        self._taken: list[Any] = []  # get_stats() payloads (each call resets vLLM's counters)
        self.stored_keys: set[bytes] = set()  # keys this engine computed and stored
        self.hit_keys: set[bytes] = set()  # keys this engine loaded

    def slot(self, chunk: int) -> memoryview:
        return self.flat[chunk * self.block_bytes : (chunk + 1) * self.block_bytes]

    def step(self) -> None:
        self.manager.on_schedule_end(_STEP)

    def new_context(self, req_id: str) -> Any:
        return ReqContext(req_id=req_id)

    def our_tiers(self) -> list[Any]:
        """Our tiers behind the manager (the driver waits on their jobs)."""
        return [t.tier for t in self.manager.secondary_tiers if hasattr(t, "tier")]

    def request(self, keys: Sequence[bytes]) -> int:
        """One request; returns its prefix hits (blocks loaded from vLLM's CPU tier)."""
        self._next += 1
        ctx = self.new_context(f"r{self._next}")
        m = self.manager
        R = self.lookup_result  # vLLM's enum or ours
        m.on_new_request(ctx)
        waited = 0
        ready: set[bytes] = set()  # keys that were HIT in the previous pass
        while True:  # vLLM's _maximal_prefix_lookup, asked again each step while deferred
            hits, deferred, unknown = 0, False, False
            was_ready, ready = ready, set()
            for key in keys:
                result = m.lookup(key, ctx)
                if key in was_ready and result is not R.HIT:
                    self.counts.lost_between_passes += 1
                if result is R.HIT:
                    ready.add(key)
                if result in (R.HIT, R.HIT_PENDING):
                    hits += 1
                    deferred |= result is R.HIT_PENDING
                elif result is R.RETRY:
                    deferred = unknown = True  # vLLM keeps scanning to start other lookups
                else:
                    break
            if not deferred:
                break
            if waited >= self.max_wait_steps:
                self.counts.gave_up += 1
                hits = 0
                break
            waited += 1
            self.counts.waits += 1
            self.step()
            self._wait_io(0.0005, nap_too=unknown)  # an existence check is no job: nap
        if hits:
            self.hit_keys.update(keys[:hits])
            spec = m.prepare_load(keys[:hits], ctx)
            for key, chunk in zip(keys[:hits], spec.block_ids, strict=True):
                data = bytes(self.slot(int(chunk)))
                self.counts.loaded_bytes += len(data)
                if data != block_pattern(key, self.block_bytes):
                    self.counts.bad_bytes += len(data)
            m.complete_load(keys[:hits], ctx)
        rest = list(keys[hits:])
        if rest:
            out = m.prepare_store(rest, ctx)
            if out is not None and out.keys_to_store:
                for key, chunk in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
                    self.slot(int(chunk))[:] = block_pattern(key, self.block_bytes)
                m.complete_store(out.keys_to_store, ctx)
                self.counts.stored += len(out.keys_to_store)
                self.stored_keys.update(out.keys_to_store)
        m.on_request_finished(ctx)
        self.step()
        self.counts.requests += 1
        self.counts.block_accesses += len(keys)
        self.counts.prefix_hits += hits
        return hits

    def settle(self, timeout: float = 10.0) -> None:
        """Step until no tier job is in flight (cascades done)."""
        deadline = time.monotonic() + timeout
        while self.manager.has_pending_work() and time.monotonic() < deadline:
            self.step()
            self._wait_io(0.001)
        self.step()

    def _wait_io(self, nap: float, nap_too: bool = False) -> None:
        """Wait for our tiers' jobs (event-based, no spin); other tiers, or ``nap_too``
        (an answer still unknown): also a short nap."""
        ours = self.our_tiers()
        if not ours or self.wait_on_tiers_s <= 0:
            time.sleep(nap)
            return
        for tier in ours:
            tier.drain(self.wait_on_tiers_s)
        if nap_too:
            time.sleep(nap)

    def replay(self, requests: Sequence[Sequence[bytes]], settle: bool = True) -> ReplayCounts:
        """Each request in turn; with ``settle``, every cascade finishes before the next one
        (so hits do not depend on thread timing and can be compared with a model)."""
        for keys in requests:
            self.request(keys)
            if settle:
                self.settle()
        return self.counts

    def tier_counters(self, name: str) -> dict[str, float]:
        """A counter of vLLM's stats (e.g. ``CHUNK_HITS``) by tier label, from ``get_stats``."""
        stats = self.manager.get_stats()
        self._taken.append(stats)
        out: dict[str, float] = {}
        for taken in self._taken:
            if taken is None:
                continue
            for labels, value in taken.data["data"].get(name, {}).items():
                key = labels[0] if labels else ""
                out[key] = out.get(key, 0.0) + value
        return out

    def close(self) -> None:
        self.flat.release()  # our export of vLLM's buffer, so vLLM can unmap it
        self.manager.shutdown()


class OurTieringDriver(VllmTieringDriver):
    """The same driver over kvoffload's own ``TieringManager`` (``step()`` per scheduler step)."""

    lookup_result: Any = OurLookupResult

    def __init__(self, manager: Any, memory: Any, max_wait_steps: int = 200) -> None:
        self.spec = None  # type: ignore[assignment]
        self.manager = manager
        self.memory = memory
        self.block_bytes = memory.slot_bytes
        self.max_wait_steps = max_wait_steps
        self.wait_on_tiers_s = 0.2
        self.counts = ReplayCounts()
        self._next = 0
        self._taken = []
        self.stored_keys = set()
        self.hit_keys = set()

    def slot(self, chunk: int) -> memoryview:
        return self.memory.slot_view(chunk)

    def step(self) -> None:
        self.manager.step()

    def new_context(self, req_id: str) -> Any:
        return OurReqContext(req_id=req_id)

    def our_tiers(self) -> list[Any]:
        return list(self.manager.tiers)

    def close(self) -> None:
        self.manager.shutdown()
