"""Warm-up and time windows: which requests a figure counts, and in which window.

Every cache study leaves out the cold start (the first requests fill an empty cache, so
they say little about the steady state) and many look at hit ratios over time. A
:class:`Measure` says both; the cache still sees every request (it warms up on them), only
the figures skip the warm-up. Windows are of trace time (each request's arrival), counted
from the trace start, so window ``k`` covers ``[k * window_s, (k + 1) * window_s)``;
requests in the warm-up belong to no window.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload._checks import check_int, check_number
from kvoffload.sim.records import Trace


@dataclass(frozen=True)
class Measure:
    """What the figures count: everything after the warm-up, by windows if asked.

    Attributes:
        warmup_requests: leave the first N requests out of the figures.
        warmup_s: leave the requests that arrive in the first T seconds out too.
        window_s: also report the figures per window of this many seconds of trace time.
    """

    warmup_requests: int = 0
    warmup_s: float = 0.0
    window_s: float | None = None

    def __post_init__(self) -> None:
        check_int("warmup_requests", self.warmup_requests, 0)
        check_number("warmup_s", self.warmup_s, 0.0)
        if self.window_s is not None:
            check_number("window_s", self.window_s, 0.0, low_open=True)

    @property
    def active(self) -> bool:
        """True when the figures differ from whole-trace totals (warm-up or windows asked)."""
        return self.warmup_requests > 0 or self.warmup_s > 0 or self.window_s is not None

    def describe(self) -> dict[str, object]:
        return {
            "warmup_requests": self.warmup_requests,
            "warmup_s": self.warmup_s,
            "window_s": self.window_s,
        }


def first_measured(trace: Trace, measure: Measure) -> int:
    """Index of the first request the figures count (``len(requests)``: none)."""
    requests = trace.requests
    index = min(measure.warmup_requests, len(requests))
    if measure.warmup_s > 0:
        start = requests[0].timestamp_s if requests else 0.0
        while index < len(requests) and requests[index].timestamp_s - start < measure.warmup_s:
            index += 1
    return index


def window_of(timestamp_s: float, start_s: float, window_s: float) -> int:
    """The window a request arriving at ``timestamp_s`` falls in (trace start ``start_s``)."""
    return max(0, int((timestamp_s - start_s) // window_s))


def request_windows(trace: Trace, measure: Measure) -> list[int]:
    """Each request's window (``-1``: in the warm-up; ``0`` for all without windows)."""
    first = first_measured(trace, measure)
    requests = trace.requests
    out = [-1] * first
    if measure.window_s is None:
        out += [0] * (len(requests) - first)
        return out
    start = requests[0].timestamp_s if requests else 0.0
    width = measure.window_s
    out += [window_of(r.timestamp_s, start, width) for r in requests[first:]]
    return out


class HitRatios:
    """The three hit ratios of anything that counts accesses, hits and tokens."""

    block_accesses: int
    block_hits: int
    prefix_hit_blocks: int
    tokens: int
    token_hits: int

    @property
    def block_hit_ratio(self) -> float:
        return self.block_hits / self.block_accesses if self.block_accesses else 0.0

    @property
    def prefix_hit_ratio(self) -> float:
        return self.prefix_hit_blocks / self.block_accesses if self.block_accesses else 0.0

    @property
    def token_hit_ratio(self) -> float:
        return self.token_hits / self.tokens if self.tokens else 0.0


@dataclass
class WindowFigures(HitRatios):
    """The figures of one window (or of the whole measured part: ``window=None``).

    A prefix hit is a request's leading run of hits; a request is a full hit when its whole
    prompt hits, and has some hit when its first block does.
    """

    window: int | None
    start_s: float | None
    requests: int = 0
    block_accesses: int = 0
    tokens: int = 0
    block_hits: int = 0
    prefix_hit_blocks: int = 0
    token_hits: int = 0
    requests_full_hit: int = 0
    requests_any_hit: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "window": self.window,
            "start_s": self.start_s,
            "requests": self.requests,
            "block_accesses": self.block_accesses,
            "tokens": self.tokens,
            "block_hits": self.block_hits,
            "block_hit_ratio": self.block_hit_ratio,
            "prefix_hit_blocks": self.prefix_hit_blocks,
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "token_hits": self.token_hits,
            "token_hit_ratio": self.token_hit_ratio,
            "requests_full_hit": self.requests_full_hit,
            "requests_any_hit": self.requests_any_hit,
        }


def window_figures(
    trace: Trace, measure: Measure, per_request: list[tuple[int, int]]
) -> tuple[WindowFigures, list[WindowFigures]]:
    """The measured part's figures and each window's, from each request's
    ``(block hits, prefix-hit blocks)`` in trace order."""
    windows = request_windows(trace, measure)
    total = WindowFigures(None, None)
    by_window: dict[int, WindowFigures] = {}
    width = measure.window_s
    bt = trace.block_tokens
    for request, w, (hits, run) in zip(trace.requests, windows, per_request, strict=True):
        if w < 0:
            continue
        n = len(request.block_ids)
        tokens = (n - 1) * bt + request.last_block_tokens if n else 0
        run_tokens = run * bt if run < n else tokens
        targets = [total]
        if width is not None:
            if w not in by_window:
                by_window[w] = WindowFigures(w, w * width)
            targets.append(by_window[w])
        for figures in targets:
            figures.requests += 1
            figures.block_accesses += n
            figures.tokens += tokens
            figures.block_hits += hits
            figures.prefix_hit_blocks += run
            figures.token_hits += run_tokens
            figures.requests_full_hit += n > 0 and run == n
            figures.requests_any_hit += run > 0
    return total, [by_window[w] for w in sorted(by_window)]


__all__ = [
    "Measure",
    "WindowFigures",
    "first_measured",
    "request_windows",
    "window_figures",
    "window_of",
]
