"""A per-tier circuit breaker: stop sending work to a tier that keeps failing.

Why: a tier whose medium is gone (a full disk, a dead Redis) fails every job; without a
breaker every lookup and store still pays for it, and a bad key can turn into a retry loop
(vllm #49176). After ``threshold`` failed jobs in a row the breaker opens (the tier is
skipped); after ``backoff_s`` it lets one probe job through (half-open); the probe's success
closes it, its failure re-opens it with the back-off doubled (up to ``max_backoff_s``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from kvoffload._checks import check_int
from kvoffload.tiers.base import check_seconds


class BreakerState(str, enum.Enum):
    CLOSED = "closed"  # normal
    OPEN = "open"  # tier skipped
    HALF_OPEN = "half_open"  # one probe job allowed


#: Gauge values for metrics (closed 0, half-open 1, open 2).
BREAKER_GAUGE = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}


class CircuitBreaker:
    """Consecutive-failure breaker on an injectable clock.

    Args:
        threshold: failed jobs in a row that open it (0: never opens).
        backoff_s: first wait before a half-open probe.
        max_backoff_s: cap of the doubled wait.
        clock: time source in seconds.
    """

    def __init__(
        self,
        threshold: int,
        backoff_s: float,
        max_backoff_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.threshold, self.base_backoff_s, self.max_backoff_s = self.check_settings(
            threshold, backoff_s, max_backoff_s
        )
        self._clock = clock
        self.state = BreakerState.CLOSED
        self.failures = 0  # consecutive failed jobs
        self.trips = 0  # times it opened
        self.backoff_s = self.base_backoff_s
        self.opened_at = 0.0
        self.probe_in_flight = False

    @staticmethod
    def check_settings(
        threshold: object, backoff_s: object, max_backoff_s: object
    ) -> tuple[int, float, float]:
        """The breaker's rules, named as a tier's settings (``breaker_threshold``, ...)."""
        checked = (
            check_int("breaker_threshold", threshold, 0, why=" (0: never opens)"),
            check_seconds("breaker_backoff_s", backoff_s),
            check_seconds("breaker_max_backoff_s", max_backoff_s),
        )
        if checked[2] < checked[1]:
            raise ValueError(
                f"breaker_max_backoff_s ({max_backoff_s}) must be >= "
                f"breaker_backoff_s ({backoff_s})"
            )
        return checked

    def allows(self) -> bool:
        """Whether the tier may take work now (moves OPEN to HALF_OPEN once the wait is over)."""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            if self._clock() < self.opened_at + self.backoff_s:
                return False
            self.state = BreakerState.HALF_OPEN
            self.probe_in_flight = False
        return not self.probe_in_flight

    def on_submit(self) -> None:
        """A job was submitted: in HALF_OPEN it is the probe, and no other goes until it ends."""
        if self.state is BreakerState.HALF_OPEN:
            self.probe_in_flight = True

    def record(self, success: bool) -> None:
        """A job ended: success closes the breaker, a failure counts toward opening it."""
        if success:
            self.failures = 0
            if self.state is not BreakerState.CLOSED:
                self.state = BreakerState.CLOSED
                self.backoff_s = self.base_backoff_s
            self.probe_in_flight = False
            return
        self.failures += 1
        if self.state is BreakerState.HALF_OPEN:
            self.backoff_s = min(self.max_backoff_s, self.backoff_s * 2 or self.base_backoff_s)
            self._open()
        elif (
            self.state is BreakerState.CLOSED and self.threshold and self.failures >= self.threshold
        ):
            self._open()

    def _open(self) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = self._clock()
        self.probe_in_flight = False
        self.trips += 1


__all__ = ["BREAKER_GAUGE", "BreakerState", "CircuitBreaker"]
