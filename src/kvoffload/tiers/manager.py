"""``TieringManager``: the CPU tier as gateway, secondary tiers behind it, one vLLM-shaped API.

Why this shape (``reference/tiering.md`` §1.3, §7.2): engines, :class:`KVOffloader` and the
simulator speak to an :class:`~kvoffload.manager.OffloadingManager`; a tiered cache must look
exactly like one so they run unchanged. All data goes device -> CPU -> secondary and back
(secondaries never touch device memory), so the CPU manager keeps owning slots, pins and
eviction, and this class only adds the moves between its slots and the secondaries: lookups
and promotions (:mod:`.promotion`), writes by each tier's policy (:mod:`.write_policies`),
completions, backpressure, breakers and resets here. ``docs/tiers.md`` has the rules.

Threading model: one scheduler thread calls it; :meth:`step` (or :meth:`poll`) once per
scheduler step submits the step's promotions and reaps completions.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import Any

from kvoffload._checks import check_int
from kvoffload.context import ReqContext
from kvoffload.events import OffloadingEvent
from kvoffload.keys import OffloadKey
from kvoffload.manager import (
    CPULoadStoreSpec,
    CPUOffloadingManager,
    OffloadingManager,
    PrepareStoreOutput,
    RequestOffloadingContext,
    TraceRecorder,
)
from kvoffload.manager.keyargs import key_list
from kvoffload.policies import CachePolicy, SwitchReport
from kvoffload.tiers.base import (
    JobKind,
    SlotMemory,
    Tier,
    TierResult,
    check_seconds,
)
from kvoffload.tiers.breaker import BREAKER_GAUGE, BreakerState
from kvoffload.tiers.costs import CPU_TIER, LoadDecider
from kvoffload.tiers.latency import LatencyHistogram
from kvoffload.tiers.promotion import TierPromotions
from kvoffload.tiers.settings import BENIGN_REASONS, SecondaryTier, TieringStats, WritePolicy
from kvoffload.tiers.tiering_state import RequestState, TierJobState, TierState

logger = logging.getLogger(__name__)

_WAIT_SLICE_S = 0.01  # longest wait on one tier's drain inside wait() before stepping again


class TieringManager(TierPromotions, OffloadingManager):
    """A CPU tier (gateway) with an ordered list of secondary tiers behind it.

    Args:
        cpu: the CPU tier's manager; it owns slots, pins and CPU eviction.
        memory: the host slots behind ``cpu`` (every tier addresses the same memory).
        tiers: secondaries, nearest first (a bare ``Tier`` means ``SecondaryTier(tier)``).
        clock: time source for the breakers' back-off (injectable for tests).
        drain_timeout_s: how long ``reset_cache`` and ``shutdown`` wait for the tiers.
        write_back_wait_s: how long a store (or promotion) that lacks CPU room waits for the
            write-backs that free it (``Tier.drain``) before it is refused.
        max_negative: bound of each tier's failed-read memory.
        negative_ttl_s: how long a failed read keeps its key from being promoted from that
            tier again (``inf``: until a put of it succeeds there). Write-through never puts
            a block the tier already holds, so a verdict that never expired would strand it.
        block_tokens / prefill_tokens_per_s / decide: the load-or-recompute decision
            (:class:`~kvoffload.tiers.costs.LoadDecider`): ``lookup_prefix`` promotes only the
            hit blocks whose reads beat recomputing them. ``decide=None`` turns it on once
            ``block_tokens`` and the prefill speed (given here or by :meth:`observe_prefill`)
            are known.
    """

    def __init__(
        self,
        cpu: CPUOffloadingManager,
        memory: SlotMemory,
        tiers: Sequence[SecondaryTier | Tier] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
        drain_timeout_s: float = 5.0,
        max_negative: int = 65536,
        write_back_wait_s: float = 0.05,
        negative_ttl_s: float = 10.0,
        block_tokens: int | None = None,
        prefill_tokens_per_s: float | None = None,
        decide: bool | None = None,
    ) -> None:
        if not isinstance(cpu, CPUOffloadingManager):
            raise TypeError(f"cpu must be a CPUOffloadingManager, got {type(cpu).__name__}")
        if not isinstance(memory, SlotMemory):
            raise TypeError(f"memory must be a SlotMemory, got {type(memory).__name__}")
        if memory.num_slots < cpu.num_blocks:
            raise ValueError(
                f"memory has {memory.num_slots} slots but the CPU tier has {cpu.num_blocks} blocks"
            )
        self.drain_timeout_s = check_seconds("drain_timeout_s", drain_timeout_s)
        self.write_back_wait_s = check_seconds("write_back_wait_s", write_back_wait_s)
        self.negative_ttl_s = check_seconds("negative_ttl_s", negative_ttl_s)
        check_int("max_negative", max_negative, 0, why=" (failed reads remembered per tier)")
        self.cpu = cpu
        self.memory = memory
        self.slot_bytes = memory.slot_bytes
        self._clock = clock
        self._max_negative = max_negative
        self._tiers: list[TierState] = []
        seen: Counter[str] = Counter()
        for i, item in enumerate(tiers):
            spec = item if isinstance(item, SecondaryTier) else SecondaryTier(item)
            if spec.tier.memory is not memory:
                raise ValueError(
                    f"tier {i} ('{spec.tier.name}') addresses other host slots than the manager; "
                    "build every tier with the manager's memory"
                )
            label = spec.label or spec.tier.name
            seen[label] += 1
            if seen[label] > 1:
                label = f"{label}#{i}"
            self._tiers.append(TierState(spec, label, clock))
        self.costs = LoadDecider(
            [st.costs for st in self._tiers],
            block_tokens=block_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            decide=decide,
        )
        self._write_back = [st for st in self._tiers if st.policy is WritePolicy.WRITE_BACK]
        reserves = [st.spec.write_back_reserve_blocks for st in self._write_back]
        self._reserve = max((r or max(1, cpu.num_blocks // 16) for r in reserves), default=0)
        self._evicting: dict[int, list[Any]] = {}  # held victim slot -> [key, writes left]
        self._generation = 0
        self._resetting = False
        self._internal = ReqContext(req_id="kvoffload-tiering")
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "promotion_allocation_failures",
                "promotions_cut",
                "retries",
                "stale_completions",
                "reset_timeouts",
                "resets",
                "stores_dropped_resetting",
                "unknown_jobs",
                "evicted_ahead",
                "write_back_waits",
                "stores_waiting_write_back",
            ),
            0,
        )

    # ---------------------------------------------------------------- helpers
    @property
    def generation(self) -> int:
        """Bumped by every ``reset_cache``; stamped on every tier job."""
        return self._generation

    @property
    def tiers(self) -> list[Tier]:
        return [st.tier for st in self._tiers]

    def tier_state(self, index: int) -> Mapping[str, Any]:
        """One tier's stats (what ``get_stats().tiers[label]`` holds)."""
        return self._tier_stats(self._tiers[index])

    def switch_policy(
        self,
        cache_policy: str | CachePolicy,
        cache_policy_module_path: str | None = None,
        req_context: ReqContext | None = None,
        **params: Any,
    ) -> SwitchReport:
        """Replace the CPU tier's eviction policy live (see
        :meth:`CPUOffloadingManager.switch_policy`): no block dropped, and the blocks held
        for writes to the secondaries stay pinned (victims being written back are out of
        any policy already)."""
        return self.cpu.switch_policy(cache_policy, cache_policy_module_path, req_context, **params)

    def promotions_in_flight(self, ctx: ReqContext | None = None) -> int:
        """Blocks being promoted into the CPU tier (queued or read; with ``ctx``, its own only):
        they read ``HIT_PENDING``."""
        queued = [owner for st in self._tiers for _, _, owner in st.queue]
        reads = [job for st in self._tiers for job in st.jobs.values() if job.kind is JobKind.GET]
        return sum(ctx is None or owner is ctx for owner in queued) + sum(
            len(job.keys) for job in reads if ctx is None or job.ctx is ctx
        )

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """The engine's measured prefill of ``tokens`` tokens in ``seconds`` (feeds the plan)."""
        self.costs.observe_prefill(tokens, seconds)

    def observe_cpu_load(self, blocks: int, nbytes: int, seconds: float) -> None:
        """A measured CPU->device load of ``blocks`` blocks (the CPU tier's cost and benefit)."""
        self.costs.record_read(CPU_TIER, blocks, nbytes, seconds)

    def latency_histograms(self) -> dict[str, Mapping[str, LatencyHistogram]]:
        """Per tier label (and ``"cpu"``): its lookup, load, promotion and store histograms."""
        out: dict[str, Mapping[str, LatencyHistogram]] = {
            st.label: st.costs.histograms for st in self._tiers
        }
        out["cpu"] = {"load": self.costs.cpu.histograms["load"]}
        return out

    # ----------------------------------------------------------- completions
    def _reap(self) -> int:
        """Process every finished tier job; returns how many."""
        done = 0
        for index, st in enumerate(self._tiers):
            if not st.jobs:
                continue
            for result in st.tier.poll():
                job = st.jobs.pop(result.job_id, None)
                if job is None:
                    self._counters["unknown_jobs"] += 1
                    continue
                done += 1
                self._finish(index, st, job, result)
        if self._resetting and not any(st.jobs for st in self._tiers):
            self._finish_reset()
        return done

    def _finish(self, index: int, st: TierState, job: TierJobState, result: TierResult) -> None:
        st.inflight_bytes -= job.nbytes
        failed = [i for i, ok in enumerate(result.ok) if not ok]
        faults = [i for i in failed if result.reasons.get(i, "failed") not in BENIGN_REASONS]
        st.breaker.record(not faults)
        st.counters["tier_evictions"] += len(result.evicted)
        stale = job.generation != self._generation
        if stale:
            st.counters["stale_completions"] += 1
            self._counters["stale_completions"] += 1
        if job.kind is JobKind.GET:
            self._finish_get(index, job, result, stale)
        elif job.kind is JobKind.PUT:
            self._finish_put(st, job, result, failed)

    def _finish_get(self, index: int, job: TierJobState, result: TierResult, stale: bool) -> None:
        # A stale read still measured the tier (a request that stopped waiting for it, then
        # a reset, must not leave its cost unknown); only a current one served tokens.
        waited = time.monotonic() - job.submitted if job.submitted else None
        served = 0 if stale else sum(result.ok)
        self.costs.record_read(index, served, result.nbytes, result.seconds, waited)
        if stale:  # the CPU reset waits for this job, so its slots are still this job's
            self.cpu.complete_promotion(job.keys, success=False)
            return
        st = self._tiers[index]
        bad = [job.keys[i] for i, ok in enumerate(result.ok) if not ok]
        good = [k for i, k in enumerate(job.keys) if result.ok[i]]
        st.counters["bytes_read"] += result.nbytes
        st.counters["read_seconds"] += result.seconds
        st.counters["promotions"] += len(good)
        st.counters["promotion_failures"] += len(bad)
        if good:
            self.cpu.complete_promotion(good, success=True)
        if bad:
            self.cpu.complete_promotion(bad, success=False)
            for key in bad:
                self._negative(st, key)
        if good:
            for nearer in self._tiers[:index]:
                if nearer.spec.fill:
                    self._write(nearer, good, job.ctx, "fill")

    def _finish_put(
        self, st: TierState, job: TierJobState, result: TierResult, failed: list[int]
    ) -> None:
        st.put_keys.difference_update(job.keys)
        if job.purpose == "write_back":
            st.write_backs -= len(job.keys)
            self._release_written(job.slots)
        else:
            self.cpu.unpin_copy(job.keys)  # the put's pin
        st.counters["bytes_written"] += result.nbytes
        st.counters["write_seconds"] += result.seconds
        st.costs.histograms["store"].observe(result.seconds)
        st.counters["blocks_written"] += len(job.keys) - len(failed)
        st.counters["write_failures"] += len(failed)
        for i in failed:
            self._drop(st, f"failed_{result.reasons.get(i, 'failed')}", 1)
        for i, key in enumerate(job.keys):
            if result.ok[i]:
                st.negative.pop(key, None)

    # -------------------------------------------------------------- the API
    def step(self) -> int:
        """Once per scheduler step: submit queued promotions, reap completions, write back."""
        if self._internal.get_state(RequestState) is not None:  # ctx-less lookups ran
            self.on_request_finished(self._internal)
        self._flush()
        done = self._reap()
        if self._write_back and not self._resetting:  # keep the reserve of free slots
            self._evict_ahead(self._reserve, ())
        return done

    poll = step

    def wait(self, timeout: float, ctx: ReqContext | None = None) -> bool:
        """Step until no tier work is pending (promotions queued or jobs in flight, each
        completion applied) or ``timeout`` seconds pass; True when none is left. With ``ctx``,
        only its promotions count: the wait ends when they have landed, whatever else (other
        requests' reads, writes) is still in flight.

        Why: a caller that must see a promotion or a write land (the synchronous facade, a
        test) waits on the tiers' own ``drain`` between steps instead of sleeping in a loop.
        """
        deadline = time.monotonic() + check_seconds("timeout", timeout)
        while True:
            self.step()
            if not (self.has_pending_work() if ctx is None else self.promotions_in_flight(ctx)):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for st in self._tiers:
                if st.jobs:  # a short slice each, so every tier's completions are reaped
                    st.tier.drain(min(left, _WAIT_SLICE_S))

    def _end_pass(self, ctx: ReqContext) -> None:
        state = ctx.get_state(RequestState)
        if state is not None:
            state.seen.clear()

    def set_recorder(self, recorder: TraceRecorder | None) -> None:
        """Record every request into ``recorder`` (``None``: stop): the CPU tier sees every
        key a request loads or offers, promotions from the secondaries included."""
        self.cpu.set_recorder(recorder)

    def prepare_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> CPULoadStoreSpec:
        """Pin the keys' CPU slots for a load to the device. The spec names CPU slots because
        every load reads the CPU tier (secondaries only promote into it), as vLLM's tiering
        manager returns its primary tier's ``CPULoadStoreSpec``."""
        keys = key_list(keys, "prepare_load")
        self._end_pass(ctx)
        spec = self.cpu.prepare_load(keys, ctx)
        for st in self._tiers:
            if st.policy is WritePolicy.SELECTIVE and not self._resetting:
                self._offer(st, keys, ctx)  # a CPU hit is an offer
        return spec

    def touch(self, keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> None:
        self.cpu.touch(keys, ctx)

    def complete_load(self, keys: Iterable[OffloadKey], ctx: ReqContext) -> None:
        self.cpu.complete_load(keys, ctx)

    def prepare_store(
        self, keys: Iterable[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        keys = key_list(keys, "prepare_store")
        self._end_pass(ctx)
        if self._resetting:
            self._counters["stores_dropped_resetting"] += 1
            return None
        self._flush()
        self._reap()
        if not self._make_room(keys, keys):
            return None
        return self.cpu.prepare_store(keys, ctx)

    def complete_store(
        self, keys: Iterable[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        keys = key_list(keys, "complete_store")
        mine = self.cpu.stores_in_flight(keys, ctx)
        self.cpu.complete_store(keys, ctx, success)
        if success and mine and self._tiers and not self._resetting:
            self._cascade(mine, ctx)

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        return self.cpu.on_new_request(ctx)

    def on_request_finished(self, ctx: ReqContext) -> None:
        state = ctx.get_state(RequestState)
        if state is not None:
            state.retries.clear()
            state.seen.clear()
        self.cpu.on_request_finished(ctx)

    def take_events(self) -> list[OffloadingEvent]:
        return self.cpu.take_events()

    def has_pending_work(self) -> bool:
        return self._resetting or any(st.jobs or st.queue for st in self._tiers)

    def reset_cache(self) -> None:
        """Drop every CPU block; tiers keep theirs. Old jobs are drained (with a deadline)."""
        self._generation += 1
        self._counters["resets"] += 1
        for st in self._tiers:
            queued, st.queue = st.queue, []
            if queued:
                self.cpu.complete_promotion([key for key, _, _ in queued], success=False)
        self._drain_tiers()
        self._resetting = True
        self._reap()  # finishes the reset when nothing is left in flight
        if self._resetting:
            self._counters["reset_timeouts"] += 1
            logger.warning(
                "reset_cache: tiers %s did not drain within %.1f s; the CPU reset waits for them",
                [st.label for st in self._tiers if st.jobs],
                self.drain_timeout_s,
            )

    def _drain_tiers(self) -> None:
        """Wait for every tier's jobs, all tiers together within ``drain_timeout_s``."""
        deadline = time.monotonic() + self.drain_timeout_s
        for st in self._tiers:
            if st.jobs:
                st.tier.drain(max(0.0, deadline - time.monotonic()))

    def _finish_reset(self) -> None:
        self.cpu.reset_cache()
        for st in self._tiers:
            if st.admission is not None:
                st.admission.reset()
        self._resetting = False

    @property
    def resetting(self) -> bool:
        """True while a reset waits for tiers that did not drain in time."""
        return self._resetting

    def _tier_stats(self, st: TierState) -> dict[str, Any]:
        out: dict[str, Any] = dict(st.counters)
        out.update(
            write_policy=st.policy.value,
            jobs_in_flight=len(st.jobs),
            inflight_bytes=st.inflight_bytes,
            queued_promotions=len(st.queue),
            write_back_blocks=st.write_backs,
            negative_keys=len(st.negative),
            breaker_state=st.breaker.state.value,
            breaker_gauge=BREAKER_GAUGE[st.breaker.state],
            breaker_trips=st.breaker.trips,
            breaker_failures=st.breaker.failures,
            drops=dict(st.drops),
            dropped_blocks=sum(st.drops.values()),
        )
        out.update(st.costs.as_dict())
        out.update({f"medium_{k}": v for k, v in st.tier.stats().items()})
        return out

    def get_stats(self) -> TieringStats:
        base = self.cpu.get_stats()
        values = {f.name: getattr(base, f.name) for f in fields(base)}
        return TieringStats(
            **values,
            tiering={
                **self._counters,
                "generation": self._generation,
                "resetting": int(self._resetting),
                **self.costs.as_dict(),
                **{f"cpu_{k}": v for k, v in self.costs.cpu.as_dict().items()},
            },
            tiers={st.label: self._tier_stats(st) for st in self._tiers},
        )

    def shutdown(self) -> None:
        """Drain (with the deadline), close every tier, then the CPU tier."""
        self._drain_tiers()
        self._reap()
        errors: list[str] = []
        for st in self._tiers:
            try:
                st.tier.close()
            except Exception as exc:  # close the others anyway, then report
                errors.append(f"{st.label}: {type(exc).__name__}: {exc}")
        self.cpu.shutdown()
        if errors:
            raise RuntimeError("closing tiers failed: " + "; ".join(errors))


def breaker_state(manager: TieringManager, index: int) -> BreakerState:
    """The breaker state of the ``index``-th secondary tier (for tests and dashboards)."""
    return manager._tiers[index].breaker.state


__all__ = [
    "BENIGN_REASONS",
    "SecondaryTier",
    "TieringManager",
    "TieringStats",
    "WritePolicy",
    "breaker_state",
]
