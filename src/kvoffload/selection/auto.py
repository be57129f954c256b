"""``auto``: run the candidate whose miniature does best, switching with hysteresis.

No fixed policy wins everywhere: which one leads depends on the traffic and the capacity.
``auto`` serves the cache with one candidate (the *active* one, the first candidate at the
start) and feeds every access to a :class:`~kvoffload.selection.shadow.ShadowEvaluator` that
replays each candidate on a hash-sampled slice of the keys. At the end of every shadow window
it compares the candidates' recent estimated hit ratios and switches the active policy to the
leader when all of these hold (the hysteresis that keeps it from flapping):

* the shadows have seen ``warmup_windows`` windows;
* the leader beats the active candidate by more than ``margin + relative_margin * active``
  (hit ratio over the recent sampled accesses), and significantly: on the recent accesses
  where exactly one of the two hit, the leader's surplus exceeds ``z`` standard deviations
  of a fair coin's (a sign test; both miniatures see the same accesses, so this is the
  noise that matters);
* with ``long_run`` (the default), the same holds since the start (undecayed counts): a
  recent lead the long run does not confirm is most often noise that reverses, and a switch
  is not free (on the generated 1% workloads, switches on recent leads alone lost hits);
* it did so in ``patience`` consecutive windows;
* at least ``min_dwell`` windows have passed since the last switch, and at least as many as
  came before it (a switch at window ``w`` allows the next one at ``2 w`` at the earliest, so
  there are at most about log2(windows) switches); each switch back to a candidate that was
  left before doubles ``min_dwell``.

A switch builds the new candidate, replays the recent real accesses (the last ``history``
times the capacity, kept as a log of the ``touch`` calls) into it with
:func:`~kvoffload.selection.switching.warm_switch`, so it starts with the ghosts, frequencies
and reuse classes it would have learned, constrained to end on the real resident set (no block
dropped, pins and pending writes kept). Without the replay a candidate switched in late starts
from nothing and loses hits until it has learned what the others knew (a forced ``mq`` ->
``kvaware`` switch on the shared trace ends further below ``kvaware`` alone cold than warm).
A switch runs in the calling thread (the replay, then the move of every resident block),
so it takes longer the larger the cache and the log: ``max_history`` caps the log in accesses
(``benchmarks/auto_switch_cost.py`` measures both). The block table is ``auto``'s own dict and
never changes identity, so a manager that caches ``block_table`` stays right across
switches. Each switch logs one INFO line, is listed in :attr:`AutoCachePolicy.switches` and
counted in ``stats()`` (``auto_switches``; ``switches`` would collide with the manager's
``policy_switches`` counter), which also carries the active
candidate's index and every shadow estimate.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvoffload._checks import check_bool, check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.factory import create_cache_policy
from kvoffload.policies.spec import PolicySpec
from kvoffload.selection.shadow import (
    ShadowEvaluator,
    copy_context,
    refresh_context,
)
from kvoffload.selection.switching import HistoryEntry, warm_switch

logger = logging.getLogger(__name__)

#: The built-ins that lead somewhere on the traces and workloads we have
#: (``benchmarks/auto_policy.py`` prints the table this choice comes from).
DEFAULT_CANDIDATES: tuple[str, ...] = ("mq", "kvaware", "arc")


@dataclass(frozen=True)
class PolicySwitch:
    """One switch: when (accesses seen), from which candidate to which, and on what evidence."""

    accesses: int
    window: int
    old: str
    new: str
    estimates: tuple[tuple[str, float], ...]
    moved: int
    replayed: int = 0  # resident blocks the history replay entered into the new candidate
    seconds: float = 0.0  # how long the switch held the calling thread (see AutoCachePolicy)


class _Logged:
    """A request's context as ``auto``'s history log keeps it (attached to the live context).

    The log holds this copy of the request's hints, refreshed at each of its calls, not the
    live context: that one carries every component's per-request state (the manager's
    record and its set of touched keys, the shadows' contexts), and a log of ``history``
    capacities kept all of it alive: hundreds of thousands of objects that the garbage
    collector walked again and again, a large share of ``auto``'s time on big caches.
    A switch's replay only copies the hints (:func:`~kvoffload.selection.shadow.copy_context`),
    so it sees the same values, and one copy per request keeps the log's per-request grouping.
    """

    __slots__ = ("copy", "owner")

    def __init__(self, owner: AutoCachePolicy, copy: ReqContext) -> None:
        self.owner = owner
        self.copy = copy


class AutoCachePolicy(CachePolicy):
    """Picks a candidate by sampled shadows.

    Serves with the candidate whose miniature does best lately, switching with hysteresis.
    """

    name = "auto"
    touches_misses = True

    def __init__(
        self,
        cache_capacity: int,
        candidates: str
        | Sequence[PolicySpec | str | tuple[str, Mapping[str, object]]] = DEFAULT_CANDIDATES,
        sample_rate: float = 0.01,
        min_shadow_blocks: int = 1024,
        window: int = 100,
        decay: float = 0.97,
        margin: float = 0.002,
        relative_margin: float = 0.02,
        patience: int = 4,
        min_dwell: int = 4,
        warmup_windows: int = 2,
        z: float = 2.0,
        history: float = 16.0,
        long_run: bool = True,
        alpha: float = 0.05,
        max_history: int | None = None,
    ) -> None:
        super().__init__(cache_capacity)
        specs = PolicySpec.parse_list(candidates, "candidates")
        if any(spec.name == "auto" for spec in specs):
            raise ValueError("auto cannot be its own candidate")
        self.margin = check_number("margin", margin, 0.0, 1.0)
        self.relative_margin = check_number("relative_margin", relative_margin, 0.0, 10.0)
        self.patience = check_int("patience", patience, 1, 2**31)
        self.min_dwell = check_int("min_dwell", min_dwell, 0, 2**31)
        self.warmup_windows = check_int("warmup_windows", warmup_windows, 0, 2**31)
        self.z = check_number("z", z, 0.0, 100.0)
        self.long_run = check_bool("long_run", long_run)
        self.alpha = check_number("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True)
        self.history = check_number("history", history, 0.0, 1e6)
        self.max_history = (
            None
            if max_history is None
            else check_int(
                "max_history", max_history, 0, 2**62, " (accesses a switch replays)", or_none=True
            )
        )
        # The recent real accesses (about ``history`` times the capacity, at most
        # ``max_history``): a switch replays them into the new candidate, so it starts with
        # what it would have learned.
        self._history_limit = int(self.history * cache_capacity)
        if self.max_history is not None:
            self._history_limit = min(self._history_limit, self.max_history)
        self._log: deque[HistoryEntry] = deque()
        self._logged = 0
        self._specs = specs
        self._shadows = ShadowEvaluator(
            cache_capacity,
            specs,
            sample_rate,
            min_shadow_blocks,
            window,
            decay,
        )
        self.candidate_names: tuple[str, ...] = tuple(self._shadows.names)
        self._last_timestamp: float | None = None  # the clock a switch hands the new policy
        self._switches: list[PolicySwitch] = []
        self._switch_seconds = 0.0
        self._reset_choice()

    def _build(self, index: int) -> CachePolicy:
        spec = self._specs[index]
        return create_cache_policy(spec.name, self.cache_capacity, None, spec.param_dict)

    def _reset_choice(self) -> None:
        self._active_index = 0
        self._active = self._build(0)
        self._streak = 0
        self._last_switch_window = 0
        self._dwell = self.min_dwell
        self._left: set[int] = set()
        self._seen_windows = 0

    # ------------------------------------------------------------ introspection
    @property
    def active(self) -> CachePolicy:
        """The candidate policy serving the cache now."""
        return self._active

    @property
    def active_name(self) -> str:
        return self.candidate_names[self._active_index]

    @property
    def shadows(self) -> ShadowEvaluator:
        return self._shadows

    @property
    def switches(self) -> list[PolicySwitch]:
        """Every switch since construction (or the last ``clear``), oldest first."""
        return list(self._switches)

    # ------------------------------------------------------------ the decision
    def _decide(self) -> None:
        shadows = self._shadows
        self._seen_windows = shadows.windows
        if shadows.windows < self.warmup_windows:
            return
        names = self.candidate_names
        recent = shadows.recent_hit_ratios()
        values = [recent[name] for name in names]
        since_start = shadows.sample_hit_ratios()  # the draw cancels in a comparison
        totals = [since_start[name] for name in names]
        active = self._active_index
        current, current_total = values[active], totals[active]
        n = max(shadows.recent_accesses, 1.0)
        n_total = max(shadows.accesses, 1)
        z, margin, relative = self.z, self.margin, self.relative_margin
        best, best_lead = -1, 0.0
        for index in range(len(names)):
            if index == active:
                continue
            wins, losses = shadows.paired(index, active)
            lead = (wins - losses) / n
            if not (  # ahead lately, by the margin and significantly
                wins - losses > z * math.sqrt(wins + losses)
                and lead > margin + relative * current
                and lead > best_lead
            ):
                continue
            if self.long_run:  # and in the long run too
                total_wins, total_losses = shadows.paired_total(index, active)
                surplus = total_wins - total_losses
                if not (
                    surplus > self._anytime_bound(total_wins + total_losses)
                    and surplus / n_total > margin + relative * current_total
                ):
                    continue
            best, best_lead = index, lead
        if best < 0:
            self._streak = 0
            return
        self._streak += 1
        if self._streak < self.patience:
            return
        since = shadows.windows - self._last_switch_window
        if since < self._dwell or since < self._last_switch_window:
            return
        self._switch_to(best, tuple(zip(names, values, strict=True)))

    def _anytime_bound(self, n: int) -> float:
        """The surplus a fair coin's ``n`` paired outcomes exceed with chance ``alpha`` at most,
        however often it is looked at (Robbins' normal-mixture boundary).

        The long-run counts are tested at every window: a fixed ``z`` would be crossed by
        chance sooner or later on a long enough stream, and each switch costs hits.
        """
        return math.sqrt((n + 1) * (math.log(n + 1) + 2.0 * math.log(1.0 / self.alpha)))

    def _switch_to(self, index: int, evidence: tuple[tuple[str, float], ...]) -> None:
        started = time.perf_counter()
        old_index, old = self._active_index, self._active
        new = self._build(index)
        ctx = ReqContext(req_id="auto-switch", timestamp=self._last_timestamp)
        report = warm_switch(old, new, self._log, resident_keys=self._blocks, req_context=ctx)
        self._active, self._active_index = new, index
        if index in self._left:  # coming back to a candidate left before: wait longer next time
            self._dwell = max(1, self._dwell) * 2
        self._left.add(old_index)
        self._streak = 0
        self._last_switch_window = self._shadows.windows
        seconds = time.perf_counter() - started
        self._switch_seconds += seconds
        event = PolicySwitch(
            accesses=self._shadows.seen,
            window=self._shadows.windows,
            old=self.candidate_names[old_index],
            new=self.candidate_names[index],
            estimates=evidence,
            moved=report.moved,
            replayed=report.replayed,
            seconds=seconds,
        )
        self._switches.append(event)
        logger.info(
            "auto: switched %s -> %s after %d accesses (estimated hit ratios %s), moved %d blocks"
            " (%d of them entered by the history replay) in %.3f s",
            event.old,
            event.new,
            event.accesses,
            ", ".join(f"{name}={value:.4f}" for name, value in evidence),
            event.moved,
            event.replayed,
            event.seconds,
        )

    # ------------------------------------------------------------ contract
    # The active candidate's table holds the same keys as auto's (the base's): each hook
    # passes its call on.
    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        self._active.insert(key, block, req_context)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        self._active.insert_many(keys, blocks, req_context)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        self._active.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        keys = tuple(keys)
        self._active.touch(keys, req_context)
        if req_context is not None:
            self._last_timestamp = req_context.timestamp
        if self._history_limit:
            self._log.append((keys, self._log_context(req_context)))
            self._logged += len(keys)
            if self._logged > self._history_limit:
                self._trim_log()
        shadows = self._shadows
        if shadows.record(keys, req_context) and shadows.windows != self._seen_windows:
            self._decide()  # a window closed (only a call that sampled a key closes one)

    def _log_context(self, ctx: ReqContext | None) -> ReqContext | None:
        """The copy of ``ctx`` the log keeps (see :class:`_Logged`), its hints as they are now."""
        if ctx is None:
            return None
        logged = ctx.get_state(_Logged)
        if logged is None or logged.owner is not self:
            logged = _Logged(self, copy_context(ctx))
            ctx.set_state(logged)
        else:
            refresh_context(logged.copy, ctx)
        return logged.copy

    def _trim_log(self) -> None:
        log, limit = self._log, self._history_limit
        while self._logged > limit and log:
            keys, _ = log.popleft()
            if keys is not None:
                self._logged -= len(keys)

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        victims = self._active.evict(n, protected)
        return None if victims is None else [key for key, _ in victims]

    def mark_evictable(self, key: OffloadKey) -> None:
        self._active.mark_evictable(key)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        self._active.mark_evictable_many(keys)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._active.mark_non_evictable(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._active.on_request_finished(req_context)
        self._shadows.request_finished(req_context)
        if self._history_limit:
            self._log.append((None, self._log_context(req_context)))

    def on_clear(self) -> None:
        self._shadows.clear()
        self._switches.clear()
        self._switch_seconds = 0.0
        self._log.clear()
        self._logged = 0
        self._reset_choice()

    def stats(self) -> Mapping[str, float]:
        out: dict[str, float] = {
            "blocks": float(len(self._blocks)),
            "active_index": float(self._active_index),
            "auto_switches": float(len(self._switches)),
            "auto_switch_seconds": self._switch_seconds,
        }
        out.update(self._shadows.stats())
        for key, value in self._active.stats().items():
            out[f"active_{key}"] = value
        return out


__all__ = ["DEFAULT_CANDIDATES", "AutoCachePolicy", "PolicySwitch"]
