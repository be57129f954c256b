"""Drives vLLM's own ``TieringOffloadingManager`` the way its scheduler does, moving real bytes.

Each request: lookups until the prefix stops at a MISS (waiting steps while a key is
``HIT_PENDING`` or ``RETRY``, bounded), a load of the hit prefix whose bytes are checked, and
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
) -> TieringOffloadingSpec:
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": num_chunks * block_bytes,
        "eviction_policy": eviction_policy,
        "secondary_tiers": secondary_tiers,
        "tier_poll_interval_s": 0,
    }
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config=extra,
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
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
    by_source: dict[str, int] = field(default_factory=dict)


class VllmTieringDriver:
    def __init__(self, spec: TieringOffloadingSpec, max_wait_steps: int = 200) -> None:
        self.spec = spec
        self.manager: Any = spec.get_manager()
        view = self.manager.primary_tier.get_kv_memoryview()
        self.block_bytes = view.strides[0]
        self.flat = view.cast("B")
        self.max_wait_steps = max_wait_steps
        self.counts = ReplayCounts()
        self._next = 0

    def slot(self, chunk: int) -> memoryview:
        return self.flat[chunk * self.block_bytes : (chunk + 1) * self.block_bytes]

    def step(self) -> None:
        self.manager.on_schedule_end(_STEP)

    def request(self, keys: Sequence[bytes]) -> int:
        """One request; returns its prefix hits (blocks loaded from vLLM's CPU tier)."""
        self._next += 1
        ctx = ReqContext(req_id=f"r{self._next}")
        m = self.manager
        m.on_new_request(ctx)
        hits = 0
        waited = 0
        while hits < len(keys):
            result = m.lookup(keys[hits], ctx)
            if result is LookupResult.HIT:
                hits += 1
                continue
            if result in (LookupResult.HIT_PENDING, LookupResult.RETRY) and (
                waited < self.max_wait_steps
            ):
                waited += 1
                self.counts.waits += 1
                self.step()
                time.sleep(0.0005)
                continue
            break
        if hits:
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
            time.sleep(0.001)
        self.step()

    def close(self) -> None:
        self.manager.shutdown()
