"""Distribution of per-request prefix-hit lengths (how many leading blocks each request hit)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def _percentile(ordered: Sequence[int], q: float) -> int:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not ordered:
        return 0
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _bucket(length: int) -> str:
    if length <= 1:
        return str(length)
    low = 1 << (length.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


@dataclass(frozen=True)
class HitLengths:
    """Summary of prefix-hit lengths: share of requests with a hit, mean, percentiles, and a
    power-of-two histogram (``"0"``, ``"1"``, ``"2-3"``, ``"4-7"``, ... -> request count)."""

    requests: int
    requests_with_hit: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    histogram: dict[str, int]

    @property
    def hit_request_ratio(self) -> float:
        return self.requests_with_hit / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "requests_with_hit": self.requests_with_hit,
            "hit_request_ratio": self.hit_request_ratio,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "histogram": self.histogram,
        }


def summarize_hit_lengths(lengths: Sequence[int]) -> HitLengths:
    """Summarize one replay's per-request prefix-hit lengths."""
    ordered = sorted(lengths)
    histogram: dict[str, int] = {}
    for length in ordered:
        key = _bucket(length)
        histogram[key] = histogram.get(key, 0) + 1
    n = len(ordered)
    return HitLengths(
        requests=n,
        requests_with_hit=sum(1 for x in ordered if x > 0),
        mean=sum(ordered) / n if n else 0.0,
        p50=_percentile(ordered, 50),
        p90=_percentile(ordered, 90),
        p99=_percentile(ordered, 99),
        max=ordered[-1] if ordered else 0,
        histogram=histogram,
    )


__all__ = ["HitLengths", "summarize_hit_lengths"]
