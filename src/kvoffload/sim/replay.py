"""Replay a trace through the real :class:`~kvoffload.manager.CPUOffloadingManager`.

The replay makes the calls an engine makes, so what it measures is what the library does.

``prefix`` mode (default), per request::

    on_new_request(ctx)
    lookup(key) for each key, head first, until the first non-HIT   -> hit prefix of length p
    prepare_load(keys[:p])          # pins the hit prefix while the request runs
    prepare_store(keys[p:])         # evicts unpinned blocks to make room; None = no room
    complete_store(stored keys)     # marks them evictable tail -> head
    complete_load(keys[:p])         # unpins the prefix tail -> head
    on_request_finished(ctx)

Releasing the stored suffix before the loaded prefix, each tail first, is **tail-first
release**: the request's head ends up most recent, as vLLM's free queue and SGLang's
leaf-first radix eviction order it. The keys after the prefix are also looked up (lookup is
pure) only to count block hits that a prefix cache could not use.

``blocks`` mode treats every block as an independent access, libCacheSim's model: lookup;
a hit is ``prepare_load`` + ``complete_load``; a miss is ``prepare_store`` +
``complete_store``, all made by one :func:`kvoffload.sim.drive.access_blocks` call per
request (the same policy calls and counters, tested against the per-key calls). A key
repeated within a request starts a new context there. With LRU or ARC it reproduces
libCacheSim's hit counts exactly.

``overlap=True`` (prefix mode) keeps requests running concurrently: a request arrives at its
timestamp, runs for ``input / prefill_tokens_per_s + output / decode_tokens_per_s`` seconds,
and its loads and stores complete only when it finishes. Running requests keep their blocks
pinned (or pending: ``HIT_PENDING`` for others, which ends their usable prefix).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from kvoffload.admission import AdmissionFilter
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey, int_key
from kvoffload.manager import CPUOffloadingManager, LookupResult
from kvoffload.policies.spec import PolicySpec
from kvoffload.selection.shadow import ShadowEvaluator
from kvoffload.sim.drive import access_blocks
from kvoffload.sim.hit_lengths import HitLengths, summarize_hit_lengths
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.windows import HitRatios, Measure, WindowFigures, window_figures

REPLAY_MODES = ("prefix", "blocks")


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: mode, concurrency model, admission, and unit conversions.

    Attributes:
        mode: ``"prefix"`` or ``"blocks"`` (see the module docstring).
        overlap: run requests concurrently by their timestamps (prefix mode only).
        prefill_tokens_per_s: prefill speed of the overlap model.
        decode_tokens_per_s: decode speed of the overlap model.
        bytes_per_token: KV bytes per token, to report stored / evicted bytes.
        store_threshold: the manager's store-after-N-offers admission (0 = store everything).
        skip_partial_tail: never store a request's last, partial block.
        partial_store: store the longest prefix that fits when a whole store does not.
        admission: a factory for extra admission filters (called once per replay).
        shadow_policies: candidates the manager evaluates on the replayed key stream
            (a :class:`~kvoffload.selection.shadow.ShadowEvaluator` handed to it as an
            observer; their estimates are in ``manager_stats`` as
            ``policy_shadow_<name>_hit_ratio``).
        shadow_sample_rate: the shadows' SHARDS sampling rate.
        shadow_min_blocks: the smallest miniature (raises the rate for small caches).
        measure: a warm-up to leave out of the figures and time windows to report
            (:mod:`kvoffload.sim.windows`); the cache sees every request either way.
    """

    mode: str = "prefix"
    overlap: bool = False
    prefill_tokens_per_s: float = 20000.0
    decode_tokens_per_s: float = 50.0
    bytes_per_token: float | None = None
    store_threshold: int = 0
    skip_partial_tail: bool = False
    partial_store: bool = False
    admission: Callable[[], AdmissionFilter] | None = None
    shadow_policies: tuple[str, ...] = ()
    shadow_sample_rate: float = 0.01
    shadow_min_blocks: int = 256
    measure: Measure = field(default_factory=Measure)

    def __post_init__(self) -> None:
        if self.mode not in REPLAY_MODES:
            raise ValueError(f"unknown replay mode '{self.mode}'; choose one of {REPLAY_MODES}")
        if self.overlap and self.mode != "prefix":
            raise ValueError("overlapped replay needs prefix mode (blocks have no requests)")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("prefill and decode speeds must be > 0 tokens per second")
        if self.bytes_per_token is not None and self.bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token must be > 0, got {self.bytes_per_token}")


@dataclass
class ReplayResult(HitRatios):
    """Everything one replay measured (ratios are of block accesses unless named otherwise).

    ``prefix_hit_blocks`` counts each request's leading run of hits, the part a prefix cache
    can load; ``token_hit_ratio`` weighs that run by its tokens (the last block may be
    partial), i.e. the share of prompt tokens that need no prefill.

    With a warm-up (``ReplayOptions.measure``) the request, access, token and hit figures
    and the hit lengths are of the measured requests only (``measured`` repeats them);
    stores, evictions, failures and the manager's stats stay whole-run counts.
    ``windows`` has one entry per time window that has requests (with ``window_s``).
    """

    policy: str
    capacity_blocks: int
    mode: str
    overlap: bool
    requests: int
    block_accesses: int
    block_hits: int
    prefix_hit_blocks: int
    tokens: int
    token_hits: int
    pending_hits: int
    stored_blocks: int
    evictions: int
    admission_rejected_blocks: int
    store_failures: int
    store_failed_blocks: int
    elapsed_s: float
    hit_lengths: HitLengths
    capacity_label: str = ""
    bytes_per_block: float | None = None
    manager_stats: dict[str, Any] = field(default_factory=dict)
    tiers: dict[str, Any] | None = None  # a multi-tier replay's per-tier report (sim.tiered)
    measure: Measure | None = None  # set when the replay had a warm-up or windows
    measured: WindowFigures | None = None
    windows: list[WindowFigures] = field(default_factory=list)

    @property
    def blocks_per_s(self) -> float:
        return self.block_accesses / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def _bytes(self, blocks: int) -> float | None:
        return None if self.bytes_per_block is None else blocks * self.bytes_per_block

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON-ready record (the ``simulate --format json`` schema)."""
        record: dict[str, Any] = {
            "policy": self.policy,
            "capacity_blocks": self.capacity_blocks,
            "capacity": self.capacity_label or str(self.capacity_blocks),
            "mode": self.mode,
            "overlap": self.overlap,
            "requests": self.requests,
            "block_accesses": self.block_accesses,
            "block_hits": self.block_hits,
            "block_hit_ratio": self.block_hit_ratio,
            "prefix_hit_blocks": self.prefix_hit_blocks,
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "tokens": self.tokens,
            "token_hits": self.token_hits,
            "token_hit_ratio": self.token_hit_ratio,
            "pending_hits": self.pending_hits,
            "stored_blocks": self.stored_blocks,
            "stored_bytes": self._bytes(self.stored_blocks),
            "evictions": self.evictions,
            "evicted_bytes": self._bytes(self.evictions),
            "admitted_blocks": self.stored_blocks,
            "admission_rejected_blocks": self.admission_rejected_blocks,
            "store_failures": self.store_failures,
            "store_failed_blocks": self.store_failed_blocks,
            "hit_length": self.hit_lengths.to_dict(),
            "elapsed_s": self.elapsed_s,
            "blocks_per_s": self.blocks_per_s,
            "manager": self.manager_stats,
        }
        if self.tiers is not None:  # only multi-tier replays have the key
            record["tiers"] = self.tiers
        if self.measure is not None:  # only replays with a warm-up or windows have these
            record["measure"] = self.measure.describe()
            record["windows"] = [w.to_dict() for w in self.windows]
        return record


class _Running(NamedTuple):
    """A started request: what finishing it needs."""

    ctx: ReqContext
    loaded: list[OffloadKey]
    stored: list[OffloadKey]
    output_tokens: int


class _Counters:
    __slots__ = (
        "block_hits",
        "evictions",
        "pending_hits",
        "prefix_hits",
        "store_failed_blocks",
        "store_failures",
        "stored",
        "token_hits",
    )

    def __init__(self) -> None:
        self.block_hits = self.prefix_hits = self.token_hits = self.pending_hits = 0
        self.stored = self.evictions = self.store_failures = self.store_failed_blocks = 0


def build_manager(
    capacity: int, policy: PolicySpec, options: ReplayOptions
) -> CPUOffloadingManager:
    """The manager a replay drives (also used by tests to replay by hand)."""
    return CPUOffloadingManager(
        capacity,
        cache_policy=policy.name,
        cache_policy_module_path=policy.module_path,
        cache_policy_params=dict(policy.params),
        store_threshold=options.store_threshold,
        admission=options.admission() if options.admission is not None else None,
        skip_partial_tail=options.skip_partial_tail,
        partial_store=options.partial_store,
        observers=_shadows(capacity, options),
    )


def _shadows(capacity: int, options: ReplayOptions) -> list[ShadowEvaluator]:
    """The manager's observers: the shadows of ``options.shadow_policies`` (none without)."""
    if not options.shadow_policies:
        return []
    return [
        ShadowEvaluator(
            capacity,
            list(options.shadow_policies),
            sample_rate=options.shadow_sample_rate,
            min_shadow_blocks=options.shadow_min_blocks,
        )
    ]


def make_context(request: TraceRequest, keys: list[OffloadKey], block_tokens: int) -> ReqContext:
    """The ReqContext of one trace request, with every hint a policy may use."""
    partial = request.last_block_tokens < block_tokens
    ctx = ReqContext(
        req_id=request.req_id,
        session_id=request.session_id,
        category=request.category,
        timestamp=request.timestamp_s,
        num_blocks=len(keys),
        partial_tail_key=keys[-1] if partial and keys else None,
        prompt_tokens=request.input_tokens,
    )
    ctx.set_key_positions(cast(list[bytes], keys), block_tokens)
    if partial and keys:
        ctx.set_offload_key_position(keys[-1], request.input_tokens)
    return ctx


def _prefix_tokens(request: TraceRequest, hits: int, block_tokens: int) -> int:
    if hits < len(request.block_ids):
        return hits * block_tokens
    return (hits - 1) * block_tokens + request.last_block_tokens


def _unique_in_order(keys: Sequence[OffloadKey]) -> list[OffloadKey]:
    return list(dict.fromkeys(keys))


def _repeat_free_segments(keys: list[OffloadKey]) -> list[list[OffloadKey]]:
    """``keys`` cut before each key that repeats one of its segment (usually one segment)."""
    if len(set(keys)) == len(keys):
        return [keys]
    segments: list[list[OffloadKey]] = [[]]
    seen: set[OffloadKey] = set()
    for key in keys:
        if key in seen:
            segments.append([])
            seen.clear()
        seen.add(key)
        segments[-1].append(key)
    return segments


class _Replayer:
    """One replay's state: the manager, the key table and the counters."""

    def __init__(self, trace: Trace, capacity: int, policy: PolicySpec, options: ReplayOptions):
        self.trace = trace
        self.options = options
        self.manager = build_manager(capacity, policy, options)
        self.keys = [int_key(i) for i in range(trace.num_unique_blocks)]
        self.counts = _Counters()
        self.hit_lengths: list[int] = []
        # (block hits, prefix-hit blocks) of each request, only for a warm-up or windows
        self.per_request: list[tuple[int, int]] | None = [] if options.measure.active else None

    def request_keys(self, request: TraceRequest) -> list[OffloadKey]:
        table = self.keys
        return [table[i] for i in request.block_ids]

    # ------------------------------------------------------------------ blocks mode
    def run_blocks(self) -> None:
        m, c, bt = self.manager, self.counts, self.trace.block_tokens
        hit = LookupResult.HIT
        probe = m.policy.get  # pure, and not counted as a lookup
        per_request = self.per_request
        for request in self.trace.requests:
            before = c.block_hits
            keys = self.request_keys(request)
            leading = True
            run = 0
            for segment in _repeat_free_segments(keys):
                # A repeat within a request is a new, independent access: a new context.
                ctx = make_context(request, keys, bt)
                if leading:  # the request's prefix-hit length, known before it loads or stores
                    for key in segment:
                        status = probe(key)
                        if status is None or status.ref_cnt < 0:
                            leading = False
                            break
                        run += 1
                ctx.prefix_hit_blocks = run
                m.on_new_request(ctx)
                out = access_blocks(m, segment, ctx)
                c.block_hits += out.results.count(hit)
                c.stored += out.stored
                c.evictions += out.evicted
                c.store_failures += out.failed
                c.store_failed_blocks += out.failed
                ctx.output_tokens = request.output_tokens
                m.on_request_finished(ctx)
            self._record_prefix(request, run)
            if per_request is not None:
                per_request.append((c.block_hits - before, run))

    def _record_prefix(self, request: TraceRequest, run: int) -> None:
        c = self.counts
        c.prefix_hits += run
        c.token_hits += _prefix_tokens(request, run, self.trace.block_tokens)
        self.hit_lengths.append(run)

    # ------------------------------------------------------------------ prefix mode
    def start_request(self, request: TraceRequest) -> _Running:
        """Look up, load the hit prefix, prepare the store; return what finishing needs."""
        m, c = self.manager, self.counts
        keys = self.request_keys(request)
        ctx = make_context(request, keys, self.trace.block_tokens)
        m.on_new_request(ctx)
        lookup, hit, miss = m.lookup, LookupResult.HIT, LookupResult.MISS
        n = len(keys)
        p = 0
        result = miss
        while p < n:
            result = lookup(keys[p], ctx)
            if result is not hit:
                break
            p += 1
        ctx.prefix_hit_blocks = p
        self._record_prefix(request, p)
        before = c.block_hits
        c.block_hits += p
        absent = 0
        if p < n:
            # keys[p] ended the prefix; the later keys are probed (lookup is pure) only to
            # count hits that a prefix cache cannot use.
            for outcome in (result, *(lookup(key, ctx) for key in keys[p + 1 :])):
                if outcome is hit:
                    c.block_hits += 1
                elif outcome is miss:
                    absent += 1
                elif outcome is LookupResult.HIT_PENDING:
                    c.pending_hits += 1
        if self.per_request is not None:
            self.per_request.append((c.block_hits - before, p))
        loaded = keys[:p]
        if loaded:
            m.prepare_load(loaded, ctx)
        stored: list[OffloadKey] = []
        rest = keys[p:]
        if rest:
            if len(set(rest)) != len(rest):
                rest = _unique_in_order(rest)
            out = m.prepare_store(rest, ctx)
            if out is None:
                c.store_failures += 1
                c.store_failed_blocks += absent
            else:
                stored = out.keys_to_store
                c.stored += len(stored)
                c.evictions += len(out.evicted_keys)
        return _Running(ctx, loaded, stored, request.output_tokens)

    def finish_request(self, running: _Running) -> None:
        """Tail-first release: the stored suffix, then the loaded prefix, each tail first."""
        m, ctx = self.manager, running.ctx
        if running.stored:
            m.complete_store(running.stored, ctx)
        if running.loaded:
            m.complete_load(running.loaded, ctx)
        ctx.output_tokens = running.output_tokens
        m.on_request_finished(ctx)

    def run_prefix(self) -> None:
        start, finish = self.start_request, self.finish_request
        for request in self.trace.requests:
            finish(start(request))

    def run_overlapped(self) -> None:
        opts = self.options
        running: list[tuple[float, int, _Running]] = []  # (finish time, arrival order, state)
        clock = 0.0
        for seq, request in enumerate(self.trace.requests):
            now = request.timestamp_s
            if now < clock:
                raise ValueError(
                    f"overlapped replay needs requests in time order: request "
                    f"'{request.req_id}' (line {request.line}) arrives at {now:.3f}s, "
                    f"before the previous one ({clock:.3f}s)"
                )
            clock = now
            while running and running[0][0] <= now:
                self.finish_request(heapq.heappop(running)[2])
            state = self.start_request(request)
            duration = (
                request.input_tokens / opts.prefill_tokens_per_s
                + request.output_tokens / opts.decode_tokens_per_s
            )
            heapq.heappush(running, (now + duration, seq, state))
        while running:
            self.finish_request(heapq.heappop(running)[2])


def replay(
    trace: Trace,
    capacity_blocks: int,
    policy: PolicySpec | str = "lru",
    options: ReplayOptions | None = None,
    capacity_label: str = "",
) -> ReplayResult:
    """Replay ``trace`` at ``capacity_blocks`` through ``policy``; return the measures."""
    options = options or ReplayOptions()
    spec = PolicySpec(policy) if isinstance(policy, str) else policy
    runner = _Replayer(trace, capacity_blocks, spec, options)
    started = time.perf_counter()
    if options.mode == "blocks":
        runner.run_blocks()
    elif options.overlap:
        runner.run_overlapped()
    else:
        runner.run_prefix()
    elapsed = time.perf_counter() - started
    stats = runner.manager.get_stats()
    c = runner.counts
    result = ReplayResult(
        policy=spec.label,
        capacity_blocks=capacity_blocks,
        mode=options.mode,
        overlap=options.overlap,
        requests=len(trace.requests),
        block_accesses=trace.block_accesses,
        block_hits=c.block_hits,
        prefix_hit_blocks=c.prefix_hits,
        tokens=trace.total_tokens,
        token_hits=c.token_hits,
        pending_hits=c.pending_hits,
        stored_blocks=c.stored,
        evictions=c.evictions,
        admission_rejected_blocks=stats.admission_rejects,
        store_failures=c.store_failures,
        store_failed_blocks=c.store_failed_blocks,
        elapsed_s=elapsed,
        hit_lengths=summarize_hit_lengths(runner.hit_lengths),
        capacity_label=capacity_label,
        bytes_per_block=(
            None
            if options.bytes_per_token is None
            else options.bytes_per_token * trace.block_tokens
        ),
        manager_stats=stats.as_dict(),
    )
    if runner.per_request is not None:
        apply_measure(result, trace, options.measure, runner.per_request)
    return result


def apply_measure(
    result: ReplayResult, trace: Trace, measure: Measure, per_request: list[tuple[int, int]]
) -> None:
    """Make ``result``'s figures those of the measured requests and add the windows."""
    measured, windows = window_figures(trace, measure, per_request)
    first = len(per_request) - measured.requests
    result.measure, result.measured, result.windows = measure, measured, windows
    result.requests = measured.requests
    result.block_accesses = measured.block_accesses
    result.tokens = measured.tokens
    result.block_hits = measured.block_hits
    result.prefix_hit_blocks = measured.prefix_hit_blocks
    result.token_hits = measured.token_hits
    result.hit_lengths = summarize_hit_lengths([run for _, run in per_request[first:]])


__all__ = [
    "REPLAY_MODES",
    "PolicySpec",
    "ReplayOptions",
    "ReplayResult",
    "apply_measure",
    "build_manager",
    "make_context",
    "replay",
]
