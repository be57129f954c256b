"""Latency histograms in the Prometheus shape: per tier, lookup, load, promotion and store.

Why apart: the cost estimates (``costs``) and the exposition (``metrics``) both use them, and
they are bookkeeping, not part of the load-or-recompute rule.
"""

from __future__ import annotations

import math

#: Latency histogram bounds in seconds: 0.1 ms to 10 s, about x2.5 apart (what a local copy,
#: a disk read, a network round trip and a stalled tier each land in).
LATENCY_BUCKETS_S = (
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: The operations each tier times: ``contains`` calls, read jobs (the tier's own time), reads
#: from submit to reap (what a request waits for) and write jobs.
LATENCY_KINDS = ("lookup", "load", "promotion", "store")


class LatencyHistogram:
    """Counts of observed seconds per bucket of :data:`LATENCY_BUCKETS_S` (Prometheus shape)."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        i = 0
        while i < len(LATENCY_BUCKETS_S) and seconds > LATENCY_BUCKETS_S[i]:
            i += 1
        self.counts[i] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(upper bound, observations at or below it)`` per bucket, ending with ``+Inf``."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*map(repr, LATENCY_BUCKETS_S), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


__all__ = ["LATENCY_BUCKETS_S", "LATENCY_KINDS", "LatencyHistogram"]
