"""Measured costs and the load-or-recompute rule: a hit must never cost time to first token.

Why: a block found in a tier is worth loading only if its bytes arrive before the model could
recompute its tokens. Peers decide this with one static knob (a byte budget per step, a timeout
formula, a minimum number of tokens); here the decision takes measured costs as inputs:

* :class:`LinearCost` is a running, outlier-bounded estimate of ``seconds = fixed +
  per_unit * units`` from completed work: a tier's reads (units are bytes) or the engine's
  prefill (units are tokens).
* :class:`QueueWait` is the same idea for the time a job waits before its tier starts it.
* :func:`plan_load` is the rule: given the tier that holds each leading block of a request's
  hit prefix, choose how many leading blocks to load so that the expected time to first token
  (tiers read in parallel, then the rest is prefilled) is the smallest. Ties go to loading.
* :class:`TierBenefit` accounts, per tier, the tokens it served, the prefill seconds they saved
  (at the marginal prefill cost), the seconds spent loading them and the net.

Everything here is standard library and pure arithmetic, so the rule is tested exhaustively
against a brute-force search over the same model.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvoffload._checks import check_int, check_number
from kvoffload.tiers.latency import LATENCY_KINDS, LatencyHistogram

#: The prior for a tier nobody has measured yet: 1 ms per job and 1 GB/s, a cautious local disk.
DEFAULT_TIER_FIXED_S = 1e-3
DEFAULT_TIER_BYTES_PER_S = 1e9
#: The prior for an engine's prefill before its first measured forward: 2,000 tokens per second.
DEFAULT_PREFILL_TOKENS_PER_S = 2000.0
#: The least weight the prior keeps (in observations): it only keeps a line defined while
#: every observation has one size.
PRIOR_WEIGHT_FLOOR = 1e-3
#: The weight the past keeps when a floor restarts a line (the restarting job weighs 1).
RESTART_WEIGHT = 1.0 / 16


class LinearCost:
    """A running, outlier-bounded estimate of ``seconds = fixed + per_unit * units``.

    A weighted least-squares line over the observations, each weight halving every
    ``half_life`` observations. Three rules (``docs/tiers.md``, Load or recompute, says why)
    make it learn a tier in one job yet not be fooled by one stalled job: the prior (two
    pseudo-observations, at 0 units and at ``prior_units``, worth ``prior_weight``
    observations together) halves with every real observation, down to
    :data:`PRIOR_WEIGHT_FLOOR`; after the first ``warmup`` observations (since construction
    or a restart) each is clipped to ``[predicted / clip, predicted * clip]``; a floor above
    the prediction (:meth:`observe_floor`) holds every prediction until a job completes, and
    that observation (at least the floor) restarts the line.
    """

    __slots__ = (
        "_clip",
        "_decay",
        "_fresh",
        "_p0",
        "_p1",
        "_prior_w",
        "_s1",
        "_stale",
        "_sx",
        "_sxx",
        "_sxy",
        "_sy",
        "_warmup",
        "floor_s",
        "observations",
    )

    def __init__(
        self,
        fixed_s: float,
        per_unit_s: float,
        *,
        prior_units: float,
        prior_weight: float = 1.0,
        half_life: float = 32.0,
        clip: float = 4.0,
        warmup: int = 3,
    ) -> None:
        fixed_s = check_number("fixed_s", fixed_s, 0.0)
        per_unit_s = check_number("per_unit_s", per_unit_s, 0.0, low_open=True)
        prior_units = check_number("prior_units", prior_units, 0.0, low_open=True)
        prior_weight = check_number("prior_weight", prior_weight, 0.0, low_open=True)
        half_life = check_number("half_life", half_life, 0.0, low_open=True)
        self._clip = check_number("clip", clip, 1.0, low_open=True)
        self._warmup = check_int("warmup", warmup, 0)
        self._decay = 0.5 ** (1.0 / half_life)
        self._s1 = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._p0 = (0.0, fixed_s)
        self._p1 = (prior_units, fixed_s + per_unit_s * prior_units)
        self._prior_w = prior_weight / 2.0  # per pseudo-observation
        self._fresh = 0  # observations since construction or the last restart
        self._stale = False  # a floor above the line: the next completion restarts it
        self.floor_s = 0.0  # every prediction is at least this until a job completes
        self.observations = 0

    def _scale(self, factor: float) -> None:
        self._s1 *= factor
        self._sx *= factor
        self._sy *= factor
        self._sxx *= factor
        self._sxy *= factor

    def _line(self) -> tuple[float, float]:
        w = self._prior_w
        (x0, y0), (x1, y1) = self._p0, self._p1
        s1 = self._s1 + 2 * w
        sx = self._sx + w * (x0 + x1)
        sy = self._sy + w * (y0 + y1)
        sxx = self._sxx + w * (x0 * x0 + x1 * x1)
        sxy = self._sxy + w * (x0 * y0 + x1 * y1)
        var = s1 * sxx - sx * sx
        mean_x = sx / s1
        mean_y = sy / s1
        if var <= 1e-12 * max(s1 * sxx, 1e-300):
            slope = mean_y / mean_x if mean_x > 0 else 0.0
            return 0.0, max(slope, 0.0)
        slope = (s1 * sxy - sx * sy) / var
        slope = max(slope, 0.0)
        fixed = mean_y - slope * mean_x
        if fixed < 0.0:  # keep the line through the data's mean with no negative latency
            fixed = 0.0
            slope = mean_y / mean_x if mean_x > 0 else slope
        return fixed, slope

    @property
    def fixed_s(self) -> float:
        """Seconds of one job (or forward) whatever its size: latency, launch, round trip."""
        return self._line()[0]

    @property
    def per_unit_s(self) -> float:
        """Marginal seconds per unit (per byte for a tier, per token for prefill)."""
        return self._line()[1]

    def predict(self, units: float) -> float:
        """Expected seconds for ``units`` of work in one job (0 units cost nothing)."""
        if units <= 0:
            return 0.0
        fixed, slope = self._line()
        return max(fixed + slope * units, self.floor_s)

    def observe(self, units: float, seconds: float) -> None:
        """Add one completed job of ``units`` that took ``seconds`` (bad samples are ignored)."""
        if not (units > 0 and math.isfinite(units) and math.isfinite(seconds) and seconds >= 0):
            return
        floor, self.floor_s = self.floor_s, 0.0
        if self._stale:  # a floor proved the line wrong: this job starts it again
            self._stale = False
            seconds = max(seconds, floor)  # the overdue job had run that long already
            self._scale(min(1.0, RESTART_WEIGHT / self._s1) if self._s1 > 0 else 1.0)
            self._prior_w = min(self._prior_w, RESTART_WEIGHT / 2)
            self._fresh = 0
        if self._fresh >= self._warmup:
            predicted = self.predict(units)
            if predicted > 0:
                seconds = min(max(seconds, predicted / self._clip), predicted * self._clip)
        self._scale(self._decay)
        self._s1 += 1.0
        self._sx += units
        self._sy += seconds
        self._sxx += units * units
        self._sxy += units * seconds
        self._prior_w = max(self._prior_w / 2.0, PRIOR_WEIGHT_FLOOR / 2)
        self._fresh += 1
        self.observations += 1

    def observe_floor(self, units: float, seconds: float) -> bool:
        """A job of ``units`` has run ``seconds`` and is not done: a lower bound on its cost.

        Returns True when it was above the prediction (the line then restarts with the
        job's completion, and predicts at least ``seconds`` until then).
        """
        if not (units > 0 and math.isfinite(seconds)) or seconds <= self.predict(units):
            return False
        self.floor_s = seconds
        self._stale = True
        return True

    def as_dict(self) -> dict[str, float]:
        fixed, slope = self._line()
        return {
            "fixed_s": fixed,
            "per_unit_s": slope,
            "units_per_s": (1.0 / slope) if slope > 0 else math.inf,
            "observations": float(self.observations),
            "floor_s": self.floor_s,
        }


class QueueWait:
    """A running, outlier-bounded mean of the seconds a job waits before its tier starts it."""

    __slots__ = ("_alpha", "_clip", "observations", "seconds")

    def __init__(self, prior_s: float = 0.0, *, half_life: float = 16.0, clip: float = 4.0):
        self.seconds = check_number("prior_s", prior_s, 0.0)
        half_life = check_number("half_life", half_life, 0.0, low_open=True)
        self._alpha = 1.0 - 0.5 ** (1.0 / half_life)
        self._clip = check_number("clip", clip, 1.0, low_open=True)
        self.observations = 0

    def observe(self, seconds: float) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        if self.seconds > 0:
            seconds = min(seconds, self.seconds * self._clip)
        self.seconds += self._alpha * (seconds - self.seconds)
        self.observations += 1


def tier_read_cost(
    fixed_s: float = DEFAULT_TIER_FIXED_S, bytes_per_s: float = DEFAULT_TIER_BYTES_PER_S
) -> LinearCost:
    """A tier's read estimate with the documented prior (seconds per job, bytes per second)."""
    bytes_per_s = check_number("bytes_per_s", bytes_per_s, 0.0, low_open=True)
    return LinearCost(fixed_s, 1.0 / bytes_per_s, prior_units=float(1 << 20))


def prefill_cost(tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S) -> LinearCost:
    """An engine's prefill estimate with the documented prior (tokens per second)."""
    tokens_per_s = check_number("tokens_per_s", tokens_per_s, 0.0, low_open=True)
    return LinearCost(0.0, 1.0 / tokens_per_s, prior_units=1024.0)


@dataclass(frozen=True)
class TierCost:
    """What reading from one tier costs now: one job's latency, its bandwidth, its queue."""

    fixed_s: float
    seconds_per_byte: float
    queue_s: float = 0.0
    floor_s: float = 0.0  # an overdue read's age: no read is expected to be quicker

    def read_seconds(self, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        return self.queue_s + max(self.fixed_s + self.seconds_per_byte * nbytes, self.floor_s)


@dataclass(frozen=True)
class LoadPlan:
    """How many leading hit blocks to load; the rest of the prompt is prefilled.

    ``load_blocks`` of ``hit_blocks``; ``blocks_by_tier`` counts the loaded blocks by source;
    ``recomputed_by_tier`` counts hit blocks left to prefill by choice, by the tier that held
    them. The seconds are the model's expectations: ``load_s`` for this plan's reads,
    ``expected_s`` for its time to first token, ``load_all_s`` and ``recompute_s`` for loading
    every hit block and for loading none (``expected_s`` is never above either).

    ``probe``: read the blocks left to recompute anyway, in the background, to measure their
    tiers again (see :class:`LoadDecider`); the request does not wait for those reads.
    """

    load_blocks: int
    hit_blocks: int
    load_s: float
    expected_s: float
    load_all_s: float
    recompute_s: float
    blocks_by_tier: Mapping[int, int] = field(default_factory=dict)
    recomputed_by_tier: Mapping[int, int] = field(default_factory=dict)
    probe: bool = False

    @property
    def deadline_s(self) -> float:
        """The longest the reads may take before recomputing everything is sooner.

        A caller waiting on the plan's reads stops waiting at this point (plus its margin) and
        prefills the whole prompt instead, so a slow tier never holds a request past the time
        recomputing would have taken.
        """
        return max(self.recompute_s - (self.expected_s - self.load_s), 0.0)


def plan_load(
    hit_tiers: Sequence[int],
    *,
    block_tokens: int,
    block_bytes: int,
    prompt_tokens: int,
    tier_costs: Mapping[int, TierCost],
    prefill: LinearCost,
) -> LoadPlan:
    """Choose how many leading hit blocks to load so the expected time to first token is least.

    ``hit_tiers[i]`` is the tier holding the request's i-th block (the hit prefix, in order).
    Loading the first ``k`` blocks costs the slowest tier's read among them (tiers read in
    parallel, each in one job); then ``prompt_tokens - k * block_tokens`` tokens are prefilled
    (at least one: the last prompt token is always recomputed for its logits). A tier missing
    from ``tier_costs`` costs nothing (the CPU tier's copy, if the caller does not model it).
    Ties go to loading more: equal time, less compute. O(len(hit_tiers) * tiers).
    """
    block_tokens = check_int("block_tokens", block_tokens, 1)
    block_bytes = check_int("block_bytes", block_bytes, 0)
    prompt_tokens = check_int("prompt_tokens", prompt_tokens, 1)
    hits = len(hit_tiers)
    counts: dict[int, int] = {}
    best_k, best_s = 0, prefill.predict(prompt_tokens)
    recompute_s = best_s
    best_load_s = 0.0
    load_all_s = best_s
    for k in range(1, hits + 1):
        tier = hit_tiers[k - 1]
        counts[tier] = counts.get(tier, 0) + 1
        load_s = 0.0
        for t, n in counts.items():
            cost = tier_costs.get(t)
            if cost is not None:
                load_s = max(load_s, cost.read_seconds(n * block_bytes))
        left = max(prompt_tokens - k * block_tokens, 1)
        total = load_s + prefill.predict(left)
        if total <= best_s:
            best_k, best_s, best_load_s = k, total, load_s
        if k == hits:
            load_all_s = total
    loaded, skipped = dict(Counter(hit_tiers[:best_k])), dict(Counter(hit_tiers[best_k:]))
    return LoadPlan(best_k, hits, best_load_s, best_s, load_all_s, recompute_s, loaded, skipped)


@dataclass
class TierBenefit:
    """What one tier saved: tokens it served, prefill seconds they spared, seconds loading."""

    tokens_served: int = 0
    prefill_seconds_saved: float = 0.0
    load_seconds: float = 0.0
    blocks_recomputed_by_choice: int = 0

    def record_load(self, tokens: int, load_seconds: float, prefill: LinearCost) -> None:
        """``tokens`` served in ``load_seconds``, saving them at the marginal prefill cost."""
        if tokens <= 0:
            return
        self.tokens_served += tokens
        self.prefill_seconds_saved += prefill.per_unit_s * tokens
        self.load_seconds += max(load_seconds, 0.0)

    @property
    def net_seconds(self) -> float:
        return self.prefill_seconds_saved - self.load_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_served": self.tokens_served,
            "prefill_seconds_saved": self.prefill_seconds_saved,
            "load_seconds": self.load_seconds,
            "net_seconds_saved": self.net_seconds,
            "blocks_recomputed_by_choice": self.blocks_recomputed_by_choice,
        }


#: The index :func:`plan_load` and :class:`LoadDecider` use for the CPU tier's blocks.
CPU_TIER = -1


class TierCosts:
    """One tier's measured costs, what it saved, and its latency histograms."""

    __slots__ = ("benefit", "histograms", "probes", "queue", "read", "skips")

    def __init__(self) -> None:
        self.read = tier_read_cost()
        self.skips = 0  # plans that recomputed this tier's blocks since its last read
        self.probes = 0  # plans overridden to read it anyway, to measure it again
        self.queue = QueueWait()
        self.benefit = TierBenefit()
        self.histograms = {kind: LatencyHistogram() for kind in LATENCY_KINDS}

    def cost(self) -> TierCost:
        read = self.read
        return TierCost(read.fixed_s, read.per_unit_s, self.queue.seconds, read.floor_s)

    def as_dict(self) -> dict[str, Any]:
        read = self.read.as_dict()
        return {
            **self.benefit.as_dict(),
            "est_read_fixed_s": read["fixed_s"],
            "est_read_bytes_per_s": read["units_per_s"],
            "est_read_observations": read["observations"],
            "est_read_floor_s": read["floor_s"],
            "est_queue_s": self.queue.seconds,
            "probes": self.probes,
        }


class LoadDecider:
    """The measured costs of a tiered cache and the per-request load-or-recompute decision.

    Holds one :class:`TierCosts` per secondary tier (fed by completed read jobs), one for the
    CPU tier (fed by the engine's CPU->device copies; a CPU tier nobody measured is free) and
    the engine's prefill estimate. ``decide``: ``True`` or ``False`` force the decision on or
    off; ``None`` (the default) turns it on once the engine gave its prefill speed (at
    construction or by :meth:`observe_prefill`) and the block size in tokens is known, since
    deciding against the prior alone could recompute blocks a fast tier would have served.

    A tier judged slower than prefill is no longer read, so nothing would tell when it
    recovers: after ``probe_every`` plans in a row that recomputed its blocks, the next plan
    is a probe, read in the background (of CPU blocks: the whole hit prefix loaded in the
    foreground; ``docs/tiers.md``, Load or recompute).
    """

    #: Plans in a row that skip a tier before one reads it again (the cost of staying current).
    probe_every = 16

    def __init__(
        self,
        tiers: Sequence[TierCosts],
        *,
        block_tokens: int | None = None,
        prefill_tokens_per_s: float | None = None,
        decide: bool | None = None,
    ) -> None:
        if block_tokens is not None:
            block_tokens = check_int("block_tokens", block_tokens, 1)
        if decide is not None and not isinstance(decide, bool):
            raise TypeError(f"decide must be a bool or None, got {type(decide).__name__}")
        self.tiers = list(tiers)
        self.cpu = TierCosts()
        self.block_tokens = block_tokens
        self.decide = decide
        self.prefill_given = prefill_tokens_per_s is not None
        self.prefill = prefill_cost(
            DEFAULT_PREFILL_TOKENS_PER_S if prefill_tokens_per_s is None else prefill_tokens_per_s
        )

    @property
    def enabled(self) -> bool:
        if self.decide is not None:
            return self.decide and self.block_tokens is not None
        return self.block_tokens is not None and (
            self.prefill_given or self.prefill.observations > 0
        )

    def costs(self, tier: int) -> TierCosts:
        return self.cpu if tier == CPU_TIER else self.tiers[tier]

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """One measured prefill forward of ``tokens`` tokens that took ``seconds``."""
        self.prefill.observe(tokens, seconds)

    def plan(
        self, hit_tiers: Sequence[int], prompt_tokens: int, block_bytes: int, *, count: bool = True
    ) -> LoadPlan:
        """The plan for a hit prefix (``CPU_TIER`` for CPU-resident blocks).

        ``count``: record its choice (blocks recomputed by choice, probes); a request's
        repeated lookups plan again but count once.
        """
        assert self.block_tokens is not None
        costs = {i: t.cost() for i, t in enumerate(self.tiers)}
        if self.cpu.read.observations:
            costs[CPU_TIER] = self.cpu.cost()
        plan_with = functools.partial(
            plan_load,
            hit_tiers,
            block_tokens=self.block_tokens,
            block_bytes=block_bytes,
            prompt_tokens=prompt_tokens,
            prefill=self.prefill,
        )
        plan = plan_with(tier_costs=costs)
        if not count:
            return plan
        skipped = [self.costs(tier) for tier in plan.recomputed_by_tier]
        probe = any(c.skips >= self.probe_every for c in skipped)
        if probe:
            for c in skipped:
                c.skips = 0
                c.probes += 1
            if CPU_TIER in plan.recomputed_by_tier:
                return plan_with(tier_costs={})  # no costs: every hit block is loaded
            plan = replace(plan, probe=True)
        for tier, n in plan.recomputed_by_tier.items():
            skipped_tier = self.costs(tier)
            skipped_tier.benefit.blocks_recomputed_by_choice += n
            if not probe:
                skipped_tier.skips += 1
        return plan

    def record_read(
        self, tier: int, blocks: int, nbytes: int, seconds: float, waited_s: float | None = None
    ) -> None:
        """A completed read of ``blocks`` good blocks from ``tier`` (``CPU_TIER``: to device).

        ``seconds`` is the job's own time; ``waited_s`` the time from submit to its result
        being seen (queue and polling included), when known.
        """
        costs = self.costs(tier)
        costs.skips = 0
        costs.read.observe(nbytes, seconds)
        costs.histograms["load"].observe(seconds)
        if waited_s is not None:
            costs.histograms["promotion"].observe(waited_s)
            costs.queue.observe(max(waited_s - seconds, 0.0))
        if self.block_tokens is not None:
            costs.benefit.record_load(blocks * self.block_tokens, seconds, self.prefill)

    def as_dict(self) -> dict[str, Any]:
        prefill = self.prefill.as_dict()
        return {
            "decide": int(self.enabled),
            "prefill_tokens_per_s": prefill["units_per_s"],
            "prefill_fixed_s": prefill["fixed_s"],
            "prefill_observations": prefill["observations"],
        }
