"""Hit-ratio curves in one pass: exact for LRU, sampled (SHARDS / miniatures) for any policy.

**Exact LRU, blocks mode.** One pass of :mod:`kvoffload.sim.stack_distance` gives every
access's stack distance; LRU at ``C`` blocks hits the accesses with a distance below ``C``,
so all capacities come from one histogram. The same distances give the other figures of
``simulate --mode blocks`` exactly: in blocks mode a request's prefix hit is its leading run
of hits (a hit never changes which blocks LRU holds, so a block present when the request
starts is still there when it is reached), i.e. the accesses whose running maximum of
distance within the request is below ``C``; tokens weigh that run by each block's tokens;
a request is a full hit when its whole run hits and has some hit when its first block does.
Bytes are blocks times the bytes per block (every block takes a whole block's KV memory),
so the byte hit ratio is the block hit ratio.

**Prefix mode is not a stack algorithm**, so it has no exact one-pass curve: its LRU leaves
a request's blocks in an order that depends on which of them hit (the loaded prefix most
recent, then the stored misses, then the hits after the first miss, which are touched but
not re-stored), and a store that does not fit fails whole; both depend on the capacity, so
the curves of two capacities are not nested. ``mrc --mode prefix`` therefore replays LRU in
prefix mode at each capacity (exact, one replay each; ``method="replay"``).

**Sampled, any policy.** Each policy runs as a miniature on a SHARDS spatial sample of the
blocks at ``capacity x rate`` blocks (:class:`~kvoffload.selection.shadow.ShadowEvaluator`,
the shadows ``auto`` uses, with their draw correction). ``sample_rate`` is SHARDS' fixed
rate; ``min_blocks`` raises it at small capacities so each miniature holds at least that
many blocks (fixed size, up to every block). With ``salts > 1`` the curve is the mean of
that many independent samples (the keys salted), and its error estimate the standard error
of that mean; with one sample there is no estimate (``None``). The driver draws the sample
itself, once per salt, with its own hash (:func:`draw_hashes`), and feeds the miniatures only
the drawn keys. ``max_sampled_blocks`` (SHARDS fixed-size) and ``max_blocks`` bound the
sample, so its cost stops growing with the trace; ``lru_control`` takes the luck of the draw
out of every policy's estimate with LRU as a control variate (its exact curve is known).
"""

from __future__ import annotations

import math
import statistics
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Any

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey, int_key
from kvoffload.selection.shadow import ShadowEvaluator, sampling_rate
from kvoffload.sim.capacity import Capacity
from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.replay import PolicySpec, ReplayOptions, _repeat_free_segments, replay
from kvoffload.sim.stack_distance import COLD, stack_distances, stack_distances_fenwick
from kvoffload.sim.windows import Measure, request_windows

METHODS = ("exact", "replay", "sampled", "sampled+lru")


@dataclass
class CurvePoint:
    """One policy at one capacity (one window, or all of them: ``window=None``).

    Counts are of the measured requests only (after the warm-up). ``prefix_hit_blocks``,
    ``token_hits`` and the request counts are ``None`` where the method cannot give them
    (sampled curves estimate block hits only).
    """

    policy: str
    capacity: str
    capacity_blocks: int
    method: str
    requests: int
    block_accesses: int
    tokens: int
    block_hit_ratio: float
    block_hits: int | None = None
    prefix_hit_blocks: int | None = None
    token_hits: int | None = None
    requests_full_hit: int | None = None
    requests_any_hit: int | None = None
    sample_rate: float = 1.0
    samples: int = 1
    error_estimate: float | None = 0.0
    window: int | None = None
    window_start_s: float | None = None
    bytes_per_block: float | None = None

    @property
    def prefix_hit_ratio(self) -> float | None:
        if self.prefix_hit_blocks is None:
            return None
        return self.prefix_hit_blocks / self.block_accesses if self.block_accesses else 0.0

    @property
    def token_hit_ratio(self) -> float | None:
        if self.token_hits is None:
            return None
        return self.token_hits / self.tokens if self.tokens else 0.0

    @property
    def request_full_hit_ratio(self) -> float | None:
        if self.requests_full_hit is None:
            return None
        return self.requests_full_hit / self.requests if self.requests else 0.0

    @property
    def request_any_hit_ratio(self) -> float | None:
        if self.requests_any_hit is None:
            return None
        return self.requests_any_hit / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON- and CSV-ready (``None``: not given by this method)."""
        per_block = self.bytes_per_block
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "capacity_blocks": self.capacity_blocks,
            "method": self.method,
            "sample_rate": self.sample_rate,
            "samples": self.samples,
            "error_estimate": self.error_estimate,
            "window": self.window,
            "window_start_s": self.window_start_s,
            "requests": self.requests,
            "block_accesses": self.block_accesses,
            "tokens": self.tokens,
            "block_hits": self.block_hits,
            "block_hit_ratio": self.block_hit_ratio,
            "byte_hit_ratio": self.block_hit_ratio,
            "hit_bytes": (
                None
                if per_block is None or self.block_hits is None
                else self.block_hits * per_block
            ),
            "prefix_hit_blocks": self.prefix_hit_blocks,
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "token_hits": self.token_hits,
            "token_hit_ratio": self.token_hit_ratio,
            "requests_full_hit": self.requests_full_hit,
            "request_full_hit_ratio": self.request_full_hit_ratio,
            "requests_any_hit": self.requests_any_hit,
            "request_any_hit_ratio": self.request_any_hit_ratio,
        }


@dataclass
class Curves:
    """Every point of one ``mrc`` run: whole-run points, then per-window points if asked."""

    points: list[CurvePoint]
    windows: list[CurvePoint] = field(default_factory=list)
    mode: str = "blocks"
    measure: Measure = field(default_factory=Measure)
    elapsed_s: float = 0.0


# --------------------------------------------------------------------------- exact LRU
def _flat(trace: Trace) -> tuple[list[int], list[int], list[int]]:
    """The flat block ids, each access's request index and each access's tokens."""
    ids: list[int] = []
    owner: list[int] = []
    tokens: list[int] = []
    bt = trace.block_tokens
    for index, request in enumerate(trace.requests):
        n = len(request.block_ids)
        ids.extend(request.block_ids)
        owner.extend([index] * n)
        if n:
            tokens.extend([bt] * (n - 1))
            tokens.append(request.last_block_tokens)
    return ids, owner, tokens


def _exact_numpy(
    trace: Trace, caps: list[int], req_window: list[int], windows: int
) -> dict[str, Any]:
    import numpy as np

    requests = trace.requests
    n = trace.block_accesses
    lengths = np.fromiter((len(r.block_ids) for r in requests), np.int64, len(requests))
    ids = np.fromiter(chain.from_iterable(r.block_ids for r in requests), np.int64, n)
    distances = stack_distances(ids)
    del ids
    big = n + 1
    small = np.int32 if big + 1 < 2**31 else np.int64
    d = np.where(distances == COLD, big, distances).astype(small)
    del distances
    owner = np.repeat(np.arange(len(requests), dtype=np.int64), lengths)
    # Running maximum of the distance within each request: offset each request so one
    # cumulative maximum over the whole array never crosses a request boundary.
    offset = owner * (big + 1)
    running = (np.maximum.accumulate(d + offset) - offset).astype(small)
    del offset
    ends = np.cumsum(lengths) - 1
    starts = ends - lengths + 1
    nonempty = lengths > 0
    tokens = np.full(n, trace.block_tokens, dtype=np.int64)
    last = np.fromiter((r.last_block_tokens for r in requests), np.int64, len(requests))
    tokens[ends[nonempty]] = last[nonempty]
    caps_a = np.asarray(caps, dtype=np.int64)
    k = len(caps) + 1
    win_of_request = np.asarray(req_window, dtype=np.int64)
    win = win_of_request[owner]
    del owner
    keep = win >= 0

    def hist(values: Any, where: Any, wins: Any, weights: Any = None) -> Any:
        bucket = np.searchsorted(caps_a, values[where], side="right")
        key = wins[where] * k + bucket
        counts = np.bincount(
            key, weights=None if weights is None else weights[where], minlength=windows * k
        )
        # hits at capacity j: values below caps[j], i.e. buckets 0..j
        return np.cumsum(counts.reshape(windows, k), axis=1)[:, : k - 1]

    out: dict[str, Any] = {
        "block_hits": hist(d, keep, win),
        "prefix_hit_blocks": hist(running, keep, win),
        "token_hits": hist(running, keep, win, tokens),
        "accesses": np.bincount(win[keep], minlength=windows),
        "tokens": np.bincount(win[keep], weights=tokens[keep], minlength=windows),
    }
    req_keep = (win_of_request >= 0)[nonempty]
    req_win = win_of_request[nonempty]
    out["requests_full_hit"] = hist(running[ends[nonempty]], req_keep, req_win)
    out["requests_any_hit"] = hist(d[starts[nonempty]], req_keep, req_win)
    out["requests"] = np.bincount(win_of_request[win_of_request >= 0], minlength=windows)
    return {key: value.astype(np.int64).tolist() for key, value in out.items()}


def _exact_python(
    trace: Trace, caps: list[int], req_window: list[int], windows: int
) -> dict[str, Any]:
    """The same counts as :func:`_exact_numpy` with the standard library (small traces)."""
    ids, _owner, _tokens = _flat(trace)
    distances = stack_distances_fenwick(ids)
    k = len(caps)
    zero = [[0] * k for _ in range(windows)]
    out: dict[str, Any] = {
        name: [row[:] for row in zero]
        for name in (
            "block_hits",
            "prefix_hit_blocks",
            "token_hits",
            "requests_full_hit",
            "requests_any_hit",
        )
    }
    out["accesses"] = [0] * windows
    out["tokens"] = [0] * windows
    out["requests"] = [0] * windows
    big = len(ids) + 1
    pos = 0
    bt = trace.block_tokens
    for request, w in zip(trace.requests, req_window, strict=True):
        n = len(request.block_ids)
        ds = [big if x == COLD else x for x in distances[pos : pos + n]]
        pos += n
        if w < 0:
            continue
        out["requests"][w] += 1
        running = 0
        for t, dist in enumerate(ds):
            running = max(running, dist)
            weight = request.last_block_tokens if t == n - 1 else bt
            out["accesses"][w] += 1
            out["tokens"][w] += weight
            for j, cap in enumerate(caps):
                if dist < cap:
                    out["block_hits"][w][j] += 1
                if running < cap:
                    out["prefix_hit_blocks"][w][j] += 1
                    out["token_hits"][w][j] += weight
        if n:
            for j, cap in enumerate(caps):
                if running < cap:
                    out["requests_full_hit"][w][j] += 1
                if ds[0] < cap:
                    out["requests_any_hit"][w][j] += 1
    return out


def _have_numpy() -> bool:
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    return True


def _windows(trace: Trace, measure: Measure) -> tuple[list[int], int, list[float]]:
    req_window = request_windows(trace, measure)
    count = max(req_window, default=-1) + 1
    count = max(count, 1)
    width = measure.window_s or 0.0
    starts = [w * width for w in range(count)] if measure.window_s else [0.0]
    return req_window, count, starts


def _points(
    counts: dict[str, Any],
    caps: Sequence[Capacity],
    policy: str,
    method: str,
    row: int,
    bytes_per_block: float | None,
) -> list[CurvePoint]:
    out = []
    accesses = int(counts["accesses"][row])
    for j, cap in enumerate(caps):
        hits = int(counts["block_hits"][row][j])
        out.append(
            CurvePoint(
                policy=policy,
                capacity=cap.label,
                capacity_blocks=cap.blocks,
                method=method,
                requests=int(counts["requests"][row]),
                block_accesses=accesses,
                tokens=int(counts["tokens"][row]),
                block_hit_ratio=hits / accesses if accesses else 0.0,
                block_hits=hits,
                prefix_hit_blocks=int(counts["prefix_hit_blocks"][row][j]),
                token_hits=int(counts["token_hits"][row][j]),
                requests_full_hit=int(counts["requests_full_hit"][row][j]),
                requests_any_hit=int(counts["requests_any_hit"][row][j]),
                bytes_per_block=bytes_per_block,
            )
        )
    return out


def _sum_windows(counts: dict[str, Any]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for key, value in counts.items():
        if value and isinstance(value[0], list):
            total[key] = [[sum(col) for col in zip(*value, strict=True)]]
        else:
            total[key] = [sum(value)]
    return total


def exact_lru_curve(
    trace: Trace,
    capacities: Sequence[Capacity],
    measure: Measure | None = None,
    bytes_per_block: float | None = None,
    use_numpy: bool | None = None,
) -> Curves:
    """LRU's exact blocks-mode curve at every capacity, from one pass of stack distances.

    Equal, capacity by capacity, to ``replay(trace, C, "lru", ReplayOptions(mode="blocks"))``'s
    block hits, prefix hit blocks and token hits (``tests/sim/test_mrc.py``).
    """
    measure = measure or Measure()
    started = time.perf_counter()
    req_window, count, starts = _windows(trace, measure)
    caps = [c.blocks for c in capacities]
    order = sorted(range(len(caps)), key=caps.__getitem__)
    sorted_caps = [caps[i] for i in order]
    numpy_ok = _have_numpy() if use_numpy is None else use_numpy
    compute = _exact_numpy if numpy_ok else _exact_python
    raw = compute(trace, sorted_caps, req_window, count)
    # back to the order asked for
    counts = {
        key: (
            [[row[order.index(i)] for i in range(len(caps))] for row in value]
            if value and isinstance(value[0], list)
            else value
        )
        for key, value in raw.items()
    }
    points = _points(_sum_windows(counts), capacities, "lru", "exact", 0, bytes_per_block)
    windows: list[CurvePoint] = []
    if measure.window_s is not None:
        for row in range(count):
            for point in _points(counts, capacities, "lru", "exact", row, bytes_per_block):
                point.window, point.window_start_s = row, starts[row]
                windows.append(point)
    return Curves(points, windows, "blocks", measure, time.perf_counter() - started)


# --------------------------------------------------------------------------- prefix mode
def replayed_curve(
    trace: Trace,
    capacities: Sequence[Capacity],
    policy: PolicySpec | str = "lru",
    options: ReplayOptions | None = None,
    measure: Measure | None = None,
) -> Curves:
    """One full replay per capacity (prefix mode, where no one-pass curve is exact)."""
    measure = measure or Measure()
    options = options or ReplayOptions()
    spec = PolicySpec(policy) if isinstance(policy, str) else policy
    started = time.perf_counter()
    points: list[CurvePoint] = []
    windows: list[CurvePoint] = []
    per_block = (
        None if options.bytes_per_token is None else options.bytes_per_token * trace.block_tokens
    )
    # The replay keeps per-request figures only when asked for a warm-up or windows: one
    # window wider than any trace asks for them and changes nothing else.
    tracked = measure if measure.active else replace(measure, window_s=1e300)
    for cap in capacities:
        result = replay(trace, cap.blocks, spec, replace(options, measure=tracked), cap.label)
        assert result.measured is not None
        rows: list[tuple[int | None, list[CurvePoint]]] = [(None, points)]
        if measure.window_s is not None:
            rows += [(w, windows) for w in range(len(result.windows))]
        for row, target in rows:
            source = result.measured if row is None else result.windows[row]
            target.append(
                CurvePoint(
                    policy=spec.label,
                    capacity=cap.label,
                    capacity_blocks=cap.blocks,
                    method="replay",
                    requests=source.requests,
                    block_accesses=source.block_accesses,
                    tokens=source.tokens,
                    block_hit_ratio=source.block_hit_ratio,
                    block_hits=source.block_hits,
                    prefix_hit_blocks=source.prefix_hit_blocks,
                    token_hits=source.token_hits,
                    requests_full_hit=source.requests_full_hit,
                    requests_any_hit=source.requests_any_hit,
                    window=source.window,
                    window_start_s=source.start_s,
                    bytes_per_block=per_block,
                )
            )
    return Curves(points, windows, options.mode, measure, time.perf_counter() - started)


# --------------------------------------------------------------------------- sampled
@dataclass
class _Draw:
    """One spatial sample of the trace's blocks: the sampled accesses of each request that
    has any, with their keys (the other blocks never get a key object: bounded memory)."""

    suffix: bytes
    hashes: array[int]  # each block id's sampling hash
    requests: list[tuple[int, list[int]]]  # (request index, positions of sampled blocks)
    keys: dict[int, OffloadKey]


_M64 = (1 << 64) - 1


def draw_hashes(count: int, salt: int) -> array[int]:
    """Block ids ``0 .. count - 1``'s 32-bit sampling hashes for ``salt`` (splitmix64).

    Not the shadows' :func:`~kvoffload.selection.shadow.sample_hash`: that is CRC-32 based,
    and CRC is linear, so the blocks it keeps depend on how the ids are laid out (a generated
    trace numbers a prompt's blocks one after another), and appending a salt byte maps every
    block's CRC by the same affine map, so salted draws are far from independent. Both bias a curve
    (every salt alike, so the salts' spread does not show it); a full 64-bit mix of the id
    and the salt does not.
    """
    offset = (salt * 0xD1B54A32D192ED03) & _M64
    out = array("I", bytes(4 * count))
    for i in range(count):
        z = (i * 0x9E3779B97F4A7C15 + offset) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out[i] = (z ^ (z >> 31)) >> 32
    return out


def _draw(trace: Trace, salt: int, threshold: int) -> _Draw:
    """The accesses whose block hashes below ``threshold`` (keys salted with ``salt``)."""
    suffix = b"" if salt == 0 else bytes([salt])
    hashes = draw_hashes(trace.num_unique_blocks, salt)
    requests = []
    for index, request in enumerate(trace.requests):
        positions = [t for t, i in enumerate(request.block_ids) if hashes[i] < threshold]
        if positions:
            requests.append((index, positions))
    keys = {
        i: OffloadKey(int_key(i) + suffix)
        for i in range(trace.num_unique_blocks)
        if hashes[i] < threshold
    }
    return _Draw(suffix, hashes, requests, keys)


def _sampled_context(
    request: TraceRequest, positions: list[int], keys: list[OffloadKey], block_tokens: int
) -> ReqContext:
    """:func:`~kvoffload.sim.replay.make_context` for the sampled blocks only."""
    n = len(request.block_ids)
    partial = request.last_block_tokens < block_tokens
    last_sampled = bool(positions) and positions[-1] == n - 1
    ctx = ReqContext(
        req_id=request.req_id,
        session_id=request.session_id,
        category=request.category,
        timestamp=request.timestamp_s,
        num_blocks=n,
        partial_tail_key=keys[-1] if partial and last_sampled else None,
        prompt_tokens=request.input_tokens,
    )
    for t, key in zip(positions, keys, strict=True):
        ctx.set_offload_key_position(key, (t + 1) * block_tokens)
    if partial and last_sampled:
        ctx.set_offload_key_position(keys[-1], request.input_tokens)
    return ctx


def _sampled_once(
    trace: Trace,
    policies: Sequence[PolicySpec],
    capacity: int,
    draw: _Draw,
    mode: str,
    sample_rate: float,
    min_blocks: int,
    measure_from: int,
) -> tuple[dict[str, float], float]:
    """One sample's estimates at one capacity (every policy on the same sampled keys)."""
    shadow = ShadowEvaluator(
        capacity,
        policies,
        sample_rate=sample_rate,
        min_shadow_blocks=min_blocks,
        window=1 << 62,
        protocol="blocks" if mode == "blocks" else "requests",
        presampled=True,  # the draw's own hash picked the keys (see draw_hashes)
    )
    threshold = shadow.threshold
    hashes, keys, bt = draw.hashes, draw.keys, trace.block_tokens
    requests = trace.requests
    measured_hits: list[int] | None = None
    measured_from_accesses = 0
    picked_total = 0
    for index, positions in draw.requests:
        if measured_hits is None and index >= measure_from > 0:
            measured_hits = [e.hits for e in shadow.estimates().values()]
            measured_from_accesses = shadow.accesses
        request = requests[index]
        ids = request.block_ids
        picked = [t for t in positions if hashes[ids[t]] < threshold]
        if not picked:
            continue
        picked_total += len(picked)
        request_keys = [keys[ids[t]] for t in picked]
        ctx = _sampled_context(request, picked, request_keys, bt)
        if mode == "blocks":
            segments = _repeat_free_segments(request_keys)
        else:
            segments = [list(dict.fromkeys(request_keys))]
        for segment in segments:
            shadow.record(segment, ctx)
        ctx.output_tokens = request.output_tokens
        shadow.request_finished(ctx)
    # The accesses no miniature saw still count towards the expected sample size.
    shadow.offered(trace.block_accesses - picked_total)
    if measured_hits is None and measure_from > 0:  # no sampled request after the warm-up
        measured_hits = [e.hits for e in shadow.estimates().values()]
        measured_from_accesses = shadow.accesses
    estimates = shadow.estimates()
    if measured_hits is None:
        return {name: est.hit_ratio for name, est in estimates.items()}, shadow.rate
    # After a warm-up: the plain ratio of the measured part (the draw correction is a
    # whole-run regression; over the measured part alone it is not defined).
    sampled = shadow.accesses - measured_from_accesses
    return {
        name: (est.hits - before) / sampled if sampled else 0.0
        for (name, est), before in zip(estimates.items(), measured_hits, strict=True)
    }, shadow.rate


def sampled_curve(
    trace: Trace,
    capacities: Sequence[Capacity],
    policies: Sequence[PolicySpec],
    mode: str = "blocks",
    sample_rate: float = 0.01,
    min_blocks: int = 256,
    salts: int = 1,
    measure: Measure | None = None,
    *,
    max_sampled_blocks: int | None = None,
    max_blocks: int | None = None,
    lru_control: bool = False,
) -> Curves:
    """Every policy's estimated block hit ratio at every capacity (see the module docstring).

    ``max_sampled_blocks`` (SHARDS fixed-size) lowers ``sample_rate`` so that the draw holds
    about that many of the trace's distinct blocks: the sampled stream, and the time, stop
    growing with the trace. ``max_blocks`` lowers the rate of a capacity whose miniature would
    be bigger than that (a miniature's estimate depends on its size, not on the capacity it
    stands for); ``min_blocks`` still raises the rate of the small ones.

    ``lru_control`` (blocks mode) uses LRU as a control variate: every sample also runs an
    LRU miniature, whose error against the exact LRU curve (stack distances, one pass) is
    known; that error is subtracted from every policy's estimate of the same sample. The
    policies' errors move together (they see the same sampled blocks: a hot block drawn or
    missed raises or lowers them all), so most of the luck of the draw goes; LRU's own
    point becomes exact. Its points say so: ``method="sampled+lru"`` (plain: ``"sampled"``).

    Windows are not estimated (a window's sample is too small to say much); a warm-up is.
    """
    if lru_control and mode != "blocks":
        raise ValueError("lru_control needs mode 'blocks' (the exact LRU curve is blocks mode)")
    if salts < 1 or salts > 255:
        raise ValueError(f"salts must be in 1..255, got {salts}")
    for name, bound in (("max_sampled_blocks", max_sampled_blocks), ("max_blocks", max_blocks)):
        if bound is not None and bound < max(1, min_blocks):
            raise ValueError(f"{name} must be >= max(1, min_blocks), got {bound}")
    measure = measure or Measure()
    if measure.window_s is not None:
        raise ValueError("sampled curves have no per-window figures; drop window_s")
    from kvoffload.sim.windows import first_measured

    started = time.perf_counter()
    first = first_measured(trace, measure)
    measured = trace.requests[first:]
    accesses = sum(len(r.block_ids) for r in measured)
    tokens = sum(
        (len(r.block_ids) - 1) * trace.block_tokens + r.last_block_tokens
        for r in measured
        if r.block_ids
    )
    base_rate = sample_rate
    if max_sampled_blocks is not None and trace.num_unique_blocks:
        base_rate = min(base_rate, max_sampled_blocks / trace.num_unique_blocks)
    rates = [
        min(base_rate, max_blocks / c.blocks) if max_blocks is not None and c.blocks else base_rate
        for c in capacities
    ]
    # One draw per salt, at the highest rate any capacity needs (each capacity's miniature
    # keeps the blocks below its own threshold), held one at a time.
    thresholds = [
        min(1 << 32, int(sampling_rate(c.blocks, rate, min_blocks) * (1 << 32)))
        for c, rate in zip(capacities, rates, strict=True)
    ]
    top = max(thresholds, default=0)
    runs_by_cap: list[list[tuple[dict[str, float], float]]] = [[] for _ in capacities]
    fed = list(policies)
    exact: list[float] = []
    if lru_control:
        lru = PolicySpec("lru")
        if all(spec.label != lru.label for spec in fed):
            fed.append(lru)
        exact = [p.block_hit_ratio for p in exact_lru_curve(trace, capacities, measure).points]
    for salt in range(salts):
        draw = _draw(trace, salt, top)
        for j, (cap, rate) in enumerate(zip(capacities, rates, strict=True)):
            estimates, used = _sampled_once(
                trace, fed, cap.blocks, draw, mode, rate, min_blocks, first
            )
            if lru_control:
                shift = estimates[PolicySpec("lru").label] - exact[j]
                estimates = {name: value - shift for name, value in estimates.items()}
            runs_by_cap[j].append((estimates, used))
        del draw
    points: list[CurvePoint] = []
    for cap, runs in zip(capacities, runs_by_cap, strict=True):
        rate = runs[0][1]
        for spec in policies:
            name = spec.label
            values = [estimates[name] for estimates, _ in runs]
            mean = statistics.fmean(values)
            error = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
            points.append(
                CurvePoint(
                    policy=spec.label,
                    capacity=cap.label,
                    capacity_blocks=cap.blocks,
                    method="sampled+lru" if lru_control else "sampled",
                    requests=len(measured),
                    block_accesses=accesses,
                    tokens=tokens,
                    block_hit_ratio=mean,
                    sample_rate=rate,
                    samples=len(values),
                    error_estimate=error,
                )
            )
    return Curves(points, [], mode, measure, time.perf_counter() - started)


__all__ = [
    "METHODS",
    "CurvePoint",
    "Curves",
    "exact_lru_curve",
    "replayed_curve",
    "sampled_curve",
]
