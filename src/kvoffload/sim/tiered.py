"""Replay a trace through the real :class:`~kvoffload.tiers.manager.TieringManager`.

The CPU tier is the replayed policy's :class:`~kvoffload.manager.CPUOffloadingManager`; every
secondary is a :class:`~kvoffload.tiers.MemoryTier` (no I/O; one-byte slots, so no KV bytes
are copied) written through from the CPU. Per request (prefix mode)::

    on_new_request(ctx)
    lookup_prefix(keys, ctx)          # CPU hits, promotions from secondaries (HIT_PENDING)
    step(); lookup_prefix(keys, ctx)  # promotions done: the prefix is CPU-resident (HIT)
    prepare_load(prefix) / prepare_store(rest) / complete_store / complete_load
    on_request_finished(ctx); step()  # write-through puts complete

With ``instances > 1`` the requests go round-robin to that many CPU tiers; a shared tier
(``redis``) is one store behind all of them, a private one (``disk``) one store per instance.
The modelled load time of what each tier served, against recomputing it, is in
:func:`tier_report`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload.keys import OffloadKey, int_key
from kvoffload.manager import LookupResult
from kvoffload.sim.hit_lengths import summarize_hit_lengths
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.replay import (
    PolicySpec,
    ReplayOptions,
    ReplayResult,
    build_manager,
    make_context,
)
from kvoffload.sim.tier_config import (
    DEFAULT_BYTES_PER_TOKEN,
    TIER_TYPES,
    SimTierList,
    load_seconds,
    recompute_seconds,
)
from kvoffload.tiers import (
    BytearraySlotMemory,
    MemoryTier,
    Presence,
    ScannedBlock,
    SlotMemory,
    Tier,
    TierCapabilities,
    TierHealth,
    TierResult,
)
from kvoffload.tiers.manager import SecondaryTier, TieringManager

_HIT = LookupResult.HIT
_MISS = LookupResult.MISS
_PENDING = LookupResult.HIT_PENDING
_MAX_WAITS = 4  # steps a request waits for its promotions (one is enough for MemoryTier)


def _zero_clock() -> float:
    """Simulated tiers take no wall time: modelled time comes from the media costs."""
    return 0.0


class SharedStore:
    """One :class:`MemoryTier` behind several managers, each seeing only its own jobs."""

    def __init__(self, tier: MemoryTier) -> None:
        self.tier = tier
        self._owner: dict[int, int] = {}
        self._mailbox: dict[int, list[TierResult]] = {}

    def view(self, memory: SlotMemory) -> SharedView:
        index = len(self._mailbox)
        self._mailbox[index] = []
        return SharedView(self, index, memory)

    def submitted(self, job_id: int, owner: int) -> int:
        self._owner[job_id] = owner
        return job_id

    def results(self, owner: int) -> list[TierResult]:
        for result in self.tier.poll():
            self._mailbox[self._owner.pop(result.job_id)].append(result)
        out, self._mailbox[owner] = self._mailbox[owner], []
        return out


class SharedView(Tier):
    """One manager's handle on a :class:`SharedStore` (its ``memory`` is that manager's)."""

    def __init__(self, store: SharedStore, owner: int, memory: SlotMemory) -> None:
        super().__init__(memory)
        self.store = store
        self.owner = owner
        self.name = store.tier.name

    @property
    def capabilities(self) -> TierCapabilities:
        return self.store.tier.capabilities

    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        return self.store.tier.contains(keys)

    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        return self.store.submitted(self.store.tier.submit_put(keys, slots, generation), self.owner)

    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        return self.store.submitted(self.store.tier.submit_get(keys, slots, generation), self.owner)

    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        return self.store.submitted(self.store.tier.submit_delete(keys, generation), self.owner)

    def poll(self) -> list[TierResult]:
        return self.store.results(self.owner)

    def drain(self, timeout: float) -> bool:
        return self.store.tier.drain(timeout)

    def health(self) -> TierHealth:
        return self.store.tier.health()

    def stats(self) -> dict[str, float]:
        return self.store.tier.stats()

    def scan(self) -> Iterator[ScannedBlock]:
        return iter(())

    def close(self) -> None:  # the store outlives its views; closed with the replay
        return None


@dataclass
class _TierCounts:
    """What one tier served, summed over the instances."""

    hit_blocks: int = 0
    hit_tokens: int = 0
    batches: int = 0  # requests that read at least one block from this tier


@dataclass
class _Counts:
    block_hits: int = 0
    prefix_hits: int = 0
    token_hits: int = 0
    pending_hits: int = 0
    stored: int = 0
    evictions: int = 0
    store_failures: int = 0
    store_failed_blocks: int = 0
    hit_lengths: list[int] = field(default_factory=list)


class _TieredReplayer:
    """The managers (one per instance), their secondaries and the counters of one replay."""

    def __init__(
        self,
        trace: Trace,
        config: SimTierList,
        policy: PolicySpec,
        options: ReplayOptions,
        tier_policy: str,
    ) -> None:
        self.trace = trace
        self.config = config
        self.options = options
        cpu_blocks = config.cpu.blocks
        shared: dict[int, SharedStore] = {}
        self.managers: list[TieringManager] = []
        self.stores: list[list[Tier]] = []  # per instance, per secondary: the tier it reads
        for _ in range(config.instances):
            memory = BytearraySlotMemory(1, cpu_blocks)
            secondaries: list[SecondaryTier] = []
            tiers: list[Tier] = []
            for index, sim in enumerate(config.secondaries):
                tier: Tier
                if sim.type.shared and config.instances > 1:
                    if index not in shared:
                        shared[index] = SharedStore(
                            self._memory_tier(BytearraySlotMemory(1, cpu_blocks), sim, tier_policy)
                        )
                    tier = shared[index].view(memory)
                else:
                    tier = self._memory_tier(memory, sim, tier_policy)
                tiers.append(tier)
                secondaries.append(SecondaryTier(tier, config.write_policy, label=sim.label))
            cpu = build_manager(cpu_blocks, policy, options)
            self.managers.append(TieringManager(cpu, memory, secondaries, clock=_zero_clock))
            self.stores.append(tiers)
        self.shared = shared
        self.keys = [int_key(i) for i in range(trace.num_unique_blocks)]
        self.counts = _Counts()
        self.per_tier = [_TierCounts() for _ in config.tiers]

    @staticmethod
    def _memory_tier(memory: SlotMemory, sim: Any, tier_policy: str) -> MemoryTier:
        return MemoryTier(
            memory,
            sim.blocks * memory.slot_bytes,
            tier_policy,
            clock=_zero_clock,
            name=sim.label,
        )

    def _served_from(self, instance: int, key: OffloadKey) -> int:
        """Index (in ``config.tiers``) of the nearest secondary holding ``key``."""
        for index, tier in enumerate(self.stores[instance], start=1):
            if tier.contains([key])[0] is Presence.HIT:
                return index
        raise RuntimeError(f"promoted key {key.hex()} is in no secondary tier")

    def _in_secondary(self, instance: int, key: OffloadKey) -> bool:
        return any(t.contains([key])[0] is Presence.HIT for t in self.stores[instance])

    def run_request(self, instance: int, request: TraceRequest) -> None:
        m, c, bt = self.managers[instance], self.counts, self.trace.block_tokens
        keys = [self.keys[i] for i in request.block_ids]
        ctx = make_context(request, keys, bt)
        m.on_new_request(ctx)
        results = m.lookup_prefix(keys, ctx)
        n = len(keys)
        served: list[int] = []  # tier index of each prefix block
        for key, result in zip(keys, results, strict=True):
            if result is _HIT:
                served.append(0)
            elif result is _PENDING:
                served.append(self._served_from(instance, key))
            else:
                break
        waits = 0
        while _PENDING in results[: len(served)] and waits < _MAX_WAITS:
            m.step()
            waits += 1
            results = m.lookup_prefix(keys, ctx)
        p = 0
        while p < n and results[p] is _HIT:
            p += 1
        served = served[:p]
        self._record(request, served)
        c.block_hits += p
        absent = 0
        if p < n:
            # As the single-tier replay: the key ending the prefix and every later key are
            # asked (CPU lookup is pure; a secondary's contains too) only to count block hits.
            for i in range(p, n):
                outcome = results[p] if i == p else m.cpu.lookup(keys[i], ctx)
                if outcome is _HIT:
                    c.block_hits += 1
                elif outcome is _PENDING:
                    c.pending_hits += 1
                elif i > p and self._in_secondary(instance, keys[i]):
                    c.block_hits += 1
                else:
                    absent += 1
        loaded = keys[:p]
        if loaded:
            m.prepare_load(loaded, ctx)
        stored: list[OffloadKey] = []
        rest = list(dict.fromkeys(keys[p:]))
        if rest:
            out = m.prepare_store(rest, ctx)
            if out is None:
                c.store_failures += 1
                c.store_failed_blocks += absent
            else:
                stored = out.keys_to_store
                c.stored += len(stored)
                c.evictions += len(out.evicted_keys)
        if stored:
            m.complete_store(stored, ctx)
        if loaded:
            m.complete_load(loaded, ctx)
        ctx.output_tokens = request.output_tokens
        m.on_request_finished(ctx)
        m.step()

    def _record(self, request: TraceRequest, served: list[int]) -> None:
        c, bt = self.counts, self.trace.block_tokens
        p = len(served)
        c.prefix_hits += p
        c.hit_lengths.append(p)
        last_partial = p == len(request.block_ids) and p > 0
        used: set[int] = set()
        for position, index in enumerate(served):
            tokens = request.last_block_tokens if last_partial and position == p - 1 else bt
            counts = self.per_tier[index]
            counts.hit_blocks += 1
            counts.hit_tokens += tokens
            c.token_hits += tokens
            used.add(index)
        for index in used:
            self.per_tier[index].batches += 1

    def run(self) -> None:
        instances = len(self.managers)
        for seq, request in enumerate(self.trace.requests):
            self.run_request(seq % instances, request)


def tier_report(
    replayer: _TieredReplayer, block_bytes: float, bytes_per_token: float
) -> dict[str, Any]:
    """The ``tiers`` record of a result: totals, then one object per tier (same keys each)."""
    config, options = replayer.config, replayer.options
    accesses = replayer.trace.block_accesses
    cpu_cost = TIER_TYPES["cpu"].cost
    per_tier: list[dict[str, Any]] = []
    total_saved = 0.0
    for index, sim in enumerate(config.tiers):
        counts = replayer.per_tier[index]
        if index == 0:
            read_blocks = counts.hit_blocks
            promoted = sum(
                m.tier_state(i)["promotions"]
                for m in replayer.managers
                for i in range(len(config.secondaries))
            )
            written = replayer.counts.stored + int(promoted)
            evictions = sum(m.cpu.get_stats().evictions for m in replayer.managers)
            via = None
        else:
            states = [m.tier_state(index - 1) for m in replayer.managers]
            read_blocks = int(sum(s["promotions"] for s in states))
            written = int(sum(s["blocks_written"] for s in states))
            if sim.type.shared and config.instances > 1:
                evictions = int(replayer.shared[index - 1].tier.stats()["evictions"])
            else:
                evictions = int(sum(s["tier_evictions"] for s in states))
            via = cpu_cost
        load_s = load_seconds(counts.hit_blocks, counts.batches, block_bytes, sim.type.cost, via)
        recompute_s = recompute_seconds(counts.hit_tokens, options.prefill_tokens_per_s)
        total_saved += recompute_s - load_s
        per_tier.append(
            {
                "tier": sim.label,
                "type": sim.type.name,
                "medium": sim.type.medium,
                "shared": sim.type.shared,
                "capacity": sim.capacity.label,
                "capacity_blocks": sim.blocks,
                "hit_blocks": counts.hit_blocks,
                "hit_ratio": counts.hit_blocks / accesses if accesses else 0.0,
                "hit_tokens": counts.hit_tokens,
                "read_requests": counts.batches,
                "read_blocks": read_blocks,
                "read_bytes": read_blocks * block_bytes,
                "written_blocks": written,
                "written_bytes": written * block_bytes,
                "evictions": evictions,
                "bandwidth_bytes_per_s": sim.type.cost.bandwidth_bytes_per_s,
                "latency_s": sim.type.cost.latency_s,
                "load_s": load_s,
                "recompute_s": recompute_s,
                "saved_s": recompute_s - load_s,
            }
        )
    prefill_s = recompute_seconds(replayer.trace.total_tokens, options.prefill_tokens_per_s)
    hits = sum(t["hit_blocks"] for t in per_tier)
    return {
        "config": config.text,
        "instances": config.instances,
        "bytes_per_token": bytes_per_token,
        "block_bytes": block_bytes,
        "prefill_tokens_per_s": options.prefill_tokens_per_s,
        "hit_blocks": hits,
        "hit_ratio": hits / accesses if accesses else 0.0,
        "prefill_s": prefill_s,
        "saved_s": total_saved,
        "saved_share": total_saved / prefill_s if prefill_s > 0 else 0.0,
        "per_tier": per_tier,
    }


def tiered_replay(
    trace: Trace,
    config: SimTierList,
    policy: PolicySpec | str = "lru",
    options: ReplayOptions | None = None,
    tier_policy: str | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a :class:`TieringManager` built from ``config`` (prefix mode)."""
    options = options or ReplayOptions()
    if options.mode != "prefix":
        raise ValueError("a multi-tier replay needs prefix mode (--mode prefix)")
    if options.overlap:
        raise ValueError("a multi-tier replay does not model --overlap yet")
    spec = PolicySpec(policy) if isinstance(policy, str) else policy
    runner = _TieredReplayer(trace, config, spec, options, tier_policy or config.tier_policy)
    started = time.perf_counter()
    runner.run()
    elapsed = time.perf_counter() - started
    bytes_per_token = options.bytes_per_token or float(DEFAULT_BYTES_PER_TOKEN)
    block_bytes = bytes_per_token * trace.block_tokens
    stats = [m.get_stats() for m in runner.managers]
    c = runner.counts
    result = ReplayResult(
        policy=spec.label,
        capacity_blocks=config.cpu.blocks,
        mode=options.mode,
        overlap=False,
        requests=len(trace.requests),
        block_accesses=trace.block_accesses,
        block_hits=c.block_hits,
        prefix_hit_blocks=c.prefix_hits,
        tokens=trace.total_tokens,
        token_hits=c.token_hits,
        pending_hits=c.pending_hits,
        stored_blocks=c.stored,
        evictions=c.evictions,
        admission_rejected_blocks=sum(s.admission_rejects for s in stats),
        store_failures=c.store_failures,
        store_failed_blocks=c.store_failed_blocks,
        elapsed_s=elapsed,
        hit_lengths=summarize_hit_lengths(c.hit_lengths),
        capacity_label=config.label,
        bytes_per_block=(
            None
            if options.bytes_per_token is None
            else options.bytes_per_token * trace.block_tokens
        ),
        manager_stats=stats[0].as_dict() if len(stats) == 1 else {},
        tiers=tier_report(runner, block_bytes, bytes_per_token),
    )
    for m in runner.managers:
        m.shutdown()
    for store in runner.shared.values():
        store.tier.close()
    return result


__all__ = ["SharedStore", "SharedView", "tier_report", "tiered_replay"]
