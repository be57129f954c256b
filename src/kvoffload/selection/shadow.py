"""Shadow evaluation: miniature simulations of candidate policies on a sample of the key stream.

SHARDS (Waldspurger et al., FAST'15) spatial sampling: a key is sampled when a hash of it
falls below ``rate * 2**32``, so every access to a sampled key is seen and none of the others;
each candidate policy is replayed on the sampled accesses at ``capacity * rate`` blocks, and
its hit ratio there estimates the hit ratio it would have on the whole stream at
``capacity``. The cost is about ``rate`` times one real policy per candidate.

The miniatures are driven as the manager drives the real policy (``protocol="requests"``, the
default): each call's sampled keys are touched at once, the hits before the request's first
miss (its prefix) are pinned as loads, the misses are stored as one batch with the call's keys
protected from eviction, and the stores, then the loads (tail first), complete when the request
finishes. Driven one block at a time without pins instead (``protocol="blocks"``, the protocol
of ``kvoffload.testing.drive``), a request's blocks push each other out and its prefix ends
least recent: even at full rate on the shared trace that ranked the candidates wrongly, where
the requests protocol matches the prefix replay. Each miniature keeps its blocks in a
:class:`~kvoffload.manager.ledger.BlockLedger`, as the manager does, so neither protocol
writes the status edges again: ``blocks`` is the ledger's ``access_each`` (``pin_hits=False,
touch_misses=True``), ``requests`` its ``access``, ``pin``, ``make_room`` and ``reserve``, then
``complete`` and ``unpin`` at the request's end. They estimate block hit ratios; a
prefix cache's usable hit ratio is within a few thousandths of it (``benchmarks/shadow_error.py``
measures both).

Parameters a policy counts in accesses (MQ's ``lifetime``, ``kvaware``'s ``decay_window``;
each class declares them in ``access_count_params``) are scaled by the rate too, as SHARDS
scales the capacity.

Small caches make small miniatures, and a miniature of a few blocks says little:
``min_shadow_blocks`` raises the rate for them (fixed-size SHARDS), up to every key.

The estimate since the start corrects for the luck of the draw. A spatial sample holds a hot
key or it does not, and in a prefix-cache workload a few blocks (shared system prompts) can
carry a large share of all accesses and most of the hits, so different samples shift every
candidate's plain estimate alike by several hundredths (``docs/benchmarks.md``). The
sampled access count ``S`` moves with
those keys while its expectation ``E = rate x accesses offered`` is known exactly, so the
hits ``H`` are taken as a regression estimator on it (the SHARDS adjustment of Waldspurger
et al., FAST'15, with a fitted slope instead of their slope of 1): ``(H - b (S - E)) / E``,
where ``b = sum(a h) / sum(a^2)`` over the sampled keys' access counts ``a`` and hit counts
``h`` is the slope of hits on accesses under Bernoulli sampling of keys. A sample that drew
a hot key gives it a slope near 1 (the SHARDS adjustment); one of keys used alike gives its
plain hit ratio. ``benchmarks/shadow_error.py --salts`` measures both estimators over
different samples. The recent (windowed) estimates that ``auto`` compares stay plain ratios:
the draw shifts every candidate alike, so it cancels in a comparison.

Each miniature gets its own :class:`~kvoffload.context.ReqContext` per request (a copy of the
caller's hints), so policies that keep per-request state in the context (``kvaware``, ``sae``,
``prefix-lru``) never share it with the live policy or with each other.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import itemgetter, not_

from kvoffload._checks import check_int, check_number
from kvoffload.context import HINT_FIELDS, ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.manager.api import LookupResult
from kvoffload.manager.ledger import BlockLedger
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.factory import create_cache_policy, get_cache_policy_cls
from kvoffload.policies.spec import PolicySpec

_HASH_SPACE = 1 << 32
_MIX = 0x9E3779B1  # odd multiplier: breaks CRC32's linearity over consecutive ids
_MASK = 0xFFFFFFFF
_PLUS_ONE = (1).__add__
_HIT = LookupResult.HIT


def sample_hash(key: bytes) -> int:
    """A key's deterministic 32-bit sampling hash (the same in every process)."""
    return (zlib.crc32(key) * _MIX) & _MASK


def sampling_rate(capacity: int, sample_rate: float, min_shadow_blocks: int) -> float:
    """``sample_rate``, raised so that ``capacity * rate >= min_shadow_blocks`` (at most 1)."""
    if capacity <= 0:
        return 1.0
    return min(1.0, max(sample_rate, min_shadow_blocks / capacity))


#: How a miniature is driven: ``requests`` as the manager drives the real policy (each call's
#: keys touched at once, the prefix pinned, the misses stored as one batch with the call's
#: keys protected, completions when the request ends), ``blocks`` one key at a time.
PROTOCOLS = ("requests", "blocks")


def scaled_params(
    name: str, params: Mapping[str, object], capacity: int, rate: float
) -> dict[str, object]:
    """``params`` for a miniature of policy ``name``: the parameters its class counts in
    accesses (:attr:`CachePolicy.access_count_params`) times ``rate``, from the full-size
    policy's resolved values."""
    out = dict(params)
    counted = get_cache_policy_cls(name).access_count_params
    if not counted or rate >= 1.0:
        return out
    full = create_cache_policy(name, capacity, None, dict(params))
    for attr in counted:
        value = getattr(full, attr)
        if isinstance(value, int) and not isinstance(value, bool):
            out[attr] = max(1, round(value * rate))
    return out


class _Miniature:
    """One candidate replayed on the sampled accesses at the scaled capacity.

    Its blocks live in a :class:`~kvoffload.manager.ledger.BlockLedger`, as the manager's
    do, so the miniature makes the manager's status edges and mark hooks without writing
    them again; ``epoch`` counts :meth:`clear` calls, so a request's held blocks from before
    one are dropped, not released into the new ledger.
    """

    __slots__ = ("epoch", "hits", "label", "ledger", "policy", "window_hits")

    def __init__(self, label: str, policy: CachePolicy) -> None:
        self.label = label
        self.policy = policy
        self.ledger = BlockLedger(policy, policy.cache_capacity)
        self.epoch = 0
        self.hits = 0
        self.window_hits = 0

    def access_blocks(
        self, keys: list[OffloadKey], ctx: ReqContext | None, held: _Held | None
    ) -> list[bool]:
        """The ``blocks`` protocol: each key one independent access, no pins (the call
        :mod:`kvoffload.testing.drive` makes); each key's hit, in order."""
        results = self.ledger.access_each(keys, ctx, pin_hits=False, touch_misses=True).results
        hits = [result is _HIT for result in results]
        count = hits.count(True)
        self.hits += count
        self.window_hits += count
        return hits

    def access_request(
        self, keys: list[OffloadKey], ctx: ReqContext | None, held: _Held | None
    ) -> list[bool]:
        """One call's accesses as the manager makes them; each key's hit, in order.

        The keys are touched at once; the hits before the request's first miss (its prefix)
        are pinned as loads; the misses are made room for with every key of the call
        protected, and stored (pending) as one batch. The stores complete, then the loads,
        tail first, when the request finishes (:meth:`release`; at once without a request).
        """
        ledger = self.ledger
        get = ledger.get
        hits = [get(key) is not None for key in keys]
        ledger.access(None, keys, ctx)
        count = hits.count(True)
        self.hits += count
        self.window_hits += count
        now = held is None
        if held is None or held.epoch != self.epoch:
            held = _Held(self.epoch) if held is None else held.restart(self.epoch)
        if held.intact:
            prefix: list[OffloadKey] = []
            statuses: list[BlockStatus] = []
            for key, hit in zip(keys, hits, strict=True):
                if not hit:
                    held.intact = False
                    break
                status = get(key)
                if status is not None and status.ref_cnt >= 0:
                    prefix.append(key)
                    statuses.append(status)
            if prefix:
                ledger.pin(prefix, statuses)
                held.loaded += prefix
        if count < len(keys):
            misses = list(compress(keys, map(not_, hits)))
            if ledger.make_room(len(misses), set(keys)) is None:
                misses = misses[: ledger.num_free]  # not enough unpinned blocks: what fits
            if misses:
                ledger.reserve(misses, ctx)
                held.stored += misses
        if now:
            self.release(held)
        return hits

    def release(self, held: _Held) -> None:
        """The request's completions: its stores, then its loads, each tail first."""
        if held.epoch != self.epoch:  # held before a clear: those blocks are gone
            held.restart(self.epoch)
            return
        if held.stored:
            self.ledger.complete(held.stored)
            held.stored = []
        if held.loaded:
            held.loaded.reverse()
            self.ledger.unpin(held.loaded)
            held.loaded = []
        held.intact = True

    def clear(self) -> None:
        self.policy.clear()
        self.ledger = BlockLedger(self.policy, self.policy.cache_capacity)
        self.epoch += 1
        self.hits = self.window_hits = 0


class _Held:
    """One miniature's blocks held by one request: its loads (pinned) and pending stores."""

    __slots__ = ("epoch", "intact", "loaded", "stored")

    def __init__(self, epoch: int = 0) -> None:
        self.restart(epoch)

    def restart(self, epoch: int) -> _Held:
        """Hold nothing, for the miniature's ``epoch``; itself."""
        self.epoch = epoch
        self.intact = True  # no miss yet: hits are still the prefix (loads)
        self.loaded: list[OffloadKey] = []
        self.stored: list[OffloadKey] = []  # pending stores
        return self


class _ShadowContexts:
    """The miniatures' private contexts for one request (kept in the caller's context)."""

    __slots__ = ("contexts", "held", "owner")

    def __init__(self, owner: int, contexts: list[ReqContext]) -> None:
        self.owner = owner
        self.contexts = contexts
        self.held = [_Held() for _ in contexts]


def copy_context(ctx: ReqContext) -> ReqContext:
    """A copy of ``ctx``'s hints, without its per-request state (the key positions shared)."""
    copy = ReqContext(req_id=ctx.req_id)
    refresh_context(copy, ctx)
    return copy


def refresh_context(copy: ReqContext, ctx: ReqContext) -> None:
    """Bring a :func:`copy_context` copy's hints up to ``ctx``'s current ones (state kept;
    the key positions shared: read-only for policies)."""
    for name in HINT_FIELDS:
        setattr(copy, name, getattr(ctx, name))


@dataclass(frozen=True)
class ShadowEstimate:
    """One candidate's estimate: hit ratio since the start and over the recent windows."""

    name: str
    hit_ratio: float  # corrected for the draw (see the module docstring)
    recent_hit_ratio: float
    hits: int
    accesses: int
    capacity: int
    sample_hit_ratio: float = 0.0  # hits / sampled accesses, uncorrected


class ShadowEvaluator:
    """Hash-sampled miniature simulations of candidate policies (see the module docstring).

    Args:
        capacity: the real cache's capacity in blocks.
        candidates: the policies to evaluate: :class:`~kvoffload.policies.spec.PolicySpec`
            values, or what :meth:`~kvoffload.policies.spec.PolicySpec.parse` reads (a
            policy name, a ``(name, params)`` pair); each is labelled by its spec's
            :attr:`~kvoffload.policies.spec.PolicySpec.label`.
        sample_rate: share of the key space sampled (SHARDS rate), in (0, 1].
        min_shadow_blocks: raise the rate so a miniature holds at least this many blocks.
        window: sampled accesses per window of the recent estimate.
        decay: weight the recent estimate keeps from the windows before (0 = last only).
        presampled: the caller draws the sample itself, with a hash of its own at
            :attr:`threshold` (an offline driver that knows every block up front), and feeds
            only sampled keys: :meth:`record` takes them all, and :meth:`offered` counts the
            rest.

    ``record(keys, ctx)`` feeds one access per key, in order; ``estimates()`` reads them.
    """

    def __init__(
        self,
        capacity: int,
        candidates: Sequence[PolicySpec | str | tuple[str, Mapping[str, object]]],
        sample_rate: float = 0.01,
        min_shadow_blocks: int = 0,
        window: int = 1000,
        decay: float = 0.5,
        protocol: str = "requests",
        presampled: bool = False,
    ) -> None:
        capacity = check_int("capacity", capacity, 0, 2**62)
        self.sample_rate = check_number(
            "sample_rate", sample_rate, 0.0, 1.0, low_open=True, why=" (share of keys sampled)"
        )
        self.min_shadow_blocks = check_int("min_shadow_blocks", min_shadow_blocks, 0, 2**62)
        self.window = check_int("window", window, 1, 2**62)
        self.decay = check_number("decay", decay, 0.0, 1.0, high_open=True)
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        self.protocol = protocol
        self.presampled = presampled
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence):
            raise TypeError("candidates must be a sequence of policy names or (name, params)")
        if not candidates:
            raise ValueError("candidates must name at least one policy")
        self.capacity = capacity
        self.rate = sampling_rate(capacity, self.sample_rate, self.min_shadow_blocks)
        self.threshold = min(_HASH_SPACE, int(self.rate * _HASH_SPACE))
        self.shadow_capacity = max(1, round(capacity * self.rate)) if capacity else 0
        specs = [PolicySpec.parse(spec) for spec in candidates]
        self.names = [spec.label for spec in specs]
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"candidates must be distinct, got {self.names}")
        self._minis = [
            _Miniature(
                label,
                create_cache_policy(
                    spec.name,
                    self.shadow_capacity,
                    None,
                    scaled_params(spec.name, spec.param_dict, capacity, self.rate),
                ),
            )
            for label, spec in zip(self.names, specs, strict=True)
        ]
        self._id = id(self)
        self.accesses = 0  # sampled accesses
        self.seen = 0  # all accesses offered
        self._window_accesses = 0
        self._recent_hits = [0.0] * len(self._minis)
        self._recent_accesses = 0.0
        self.windows = 0  # completed windows
        # _wins[i][j]: decayed count of sampled accesses that candidate i hit and j missed;
        # _total_wins the same since the start, undecayed (the long-run evidence).
        self._wins = [[0.0] * len(self._minis) for _ in self._minis]
        self._total_wins = [[0] * len(self._minis) for _ in self._minis]
        # The regression estimator's sums over sampled keys (module docstring): sum(a^2) and,
        # per candidate, sum(a h), kept up to date as accesses come, from tables of the keys'
        # access and hit counts. The tables are bounded: past the limit the keys used once go,
        # then the least used (their counts so far stay in the sums; one that comes back
        # starts again at 0; the hot keys that matter are never the ones to go).
        self._key_limit = max(4096, 8 * self.shadow_capacity)
        self._key_accesses: dict[OffloadKey, int] = {}
        self._key_hits: list[dict[OffloadKey, int]] = [{} for _ in self._minis]
        self._sum_sq = 0
        self._sum_cross = [0] * len(self._minis)

    # --------------------------------------------------------------- feeding
    def _state(self, ctx: ReqContext) -> _ShadowContexts:
        state = ctx.get_state(_ShadowContexts)
        if state is None or state.owner != self._id:
            state = _ShadowContexts(self._id, [copy_context(ctx) for _ in self._minis])
            ctx.set_state(state)
        else:
            stamp, hits = ctx.timestamp, ctx.prefix_hit_blocks
            for copy in state.contexts:
                copy.timestamp = stamp
                copy.prefix_hit_blocks = hits
        return state

    def sampled(self, keys: Iterable[OffloadKey]) -> list[OffloadKey]:
        """The keys among ``keys`` that this evaluator samples, in order."""
        threshold = self.threshold
        if threshold >= _HASH_SPACE:
            return list(keys)
        crc = zlib.crc32
        return [k for k in keys if (crc(k) * _MIX) & _MASK < threshold]

    def record(self, keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> int:
        """Feed one access per key (in order) to every miniature; return how many sampled."""
        keys = keys if isinstance(keys, (list, tuple)) else list(keys)
        self.seen += len(keys)
        if self.presampled:
            picked: list[OffloadKey] = keys if isinstance(keys, list) else list(keys)
        else:
            picked = self.sampled(keys)
        if not picked:
            return 0
        minis = self._minis
        if ctx is None:
            contexts: list[ReqContext] | list[None] = [None] * len(minis)
            helds: list[_Held] | list[None] = [None] * len(minis)
        else:
            state = self._state(ctx)
            contexts, helds = state.contexts, state.held
        blocks = self.protocol == "blocks"
        rows = [
            (mini.access_blocks if blocks else mini.access_request)(picked, mctx, held)
            for mini, mctx, held in zip(minis, contexts, helds, strict=True)
        ]
        if rows.count(rows[0]) < len(rows):  # usually they all agree: nothing to pair
            self._pair(rows)
        if self.threshold < _HASH_SPACE:  # every key sampled: nothing to correct
            self._count_keys(picked, rows)
        count = len(picked)
        self.accesses += count
        self._window_accesses += count
        if self._window_accesses >= self.window:
            self._close_window()
        return count

    def offered(self, count: int) -> None:
        """Count ``count`` accesses to keys the caller knows are not sampled (an offline
        driver that filtered them with :meth:`sampled` or :func:`sample_hash`): the same as
        passing them to :meth:`record`, without hashing them again."""
        self.seen += count

    def _count_keys(self, picked: list[OffloadKey], rows: list[list[bool]]) -> None:
        """Add each sampled access to its key's counts and to the estimator's sums.

        Per key ``a -> a + 1`` adds ``2 a + 1`` to sum(a^2), and to a candidate's sum(a h)
        its ``h`` plus, on a hit, ``a + 1``; each step is one C-level pass over the call.
        """
        accesses = self._key_accesses
        before = list(map(accesses.get, picked, repeat(0)))
        self._sum_sq += 2 * sum(before) + len(picked)
        accesses.update(zip(picked, map(_PLUS_ONE, before), strict=True))
        cross = self._sum_cross
        for index, (row, hits) in enumerate(zip(rows, self._key_hits, strict=True)):
            added = sum(map(hits.get, picked, repeat(0)))
            if True in row:
                hit_keys = list(compress(picked, row))
                added += sum(compress(before, row)) + len(hit_keys)
                for key in hit_keys:
                    hits[key] = hits.get(key, 0) + 1
            cross[index] += added
        if len(accesses) > self._key_limit:
            self._prune_keys()

    def _prune_keys(self) -> None:
        """Bring the count tables down to half their limit (see ``__init__``)."""
        accesses, keep = self._key_accesses, self._key_limit // 2
        kept = {key: count for key, count in accesses.items() if count > 1}
        if len(kept) > keep:
            kept = dict(heapq.nlargest(keep, kept.items(), key=itemgetter(1)))
        self._key_accesses = kept
        self._key_hits = [
            {key: count for key, count in hits.items() if key in kept} for hits in self._key_hits
        ]

    def _corrected(self, index: int, hits: int) -> float:
        """Candidate ``index``'s hit ratio since the start, corrected for the draw."""
        sampled = self.accesses
        if not sampled:
            return 0.0
        if not self._sum_sq:  # every key sampled (nothing counted): nothing to correct
            return hits / sampled
        expected = self.seen * self.threshold / _HASH_SPACE
        slope = self._sum_cross[index] / self._sum_sq
        return min(1.0, max(0.0, (hits - slope * (sampled - expected)) / expected))

    def _pair(self, rows: list[list[bool]]) -> None:
        """Count the paired observations: each access some candidates hit and others missed."""
        wins, total_wins = self._wins, self._total_wins
        for hit in zip(*rows, strict=True):
            if any(hit) and not all(hit):  # the candidates disagree: a paired observation
                for i, hit_i in enumerate(hit):
                    if hit_i:
                        row, total_row = wins[i], total_wins[i]
                        for j, hit_j in enumerate(hit):
                            if not hit_j:
                                row[j] += 1.0
                                total_row[j] += 1

    def _close_window(self) -> None:
        decay = self.decay
        for i, mini in enumerate(self._minis):
            self._recent_hits[i] = self._recent_hits[i] * decay + mini.window_hits
            mini.window_hits = 0
        self._recent_accesses = self._recent_accesses * decay + self._window_accesses
        self._window_accesses = 0
        for row in self._wins:
            for j in range(len(row)):
                row[j] *= decay
        self.windows += 1

    def request_finished(self, ctx: ReqContext) -> None:
        """Pass the end of a request (its output length) on to the miniatures."""
        state = ctx.get_state(_ShadowContexts)
        if state is None or state.owner != self._id:
            return
        for mini, copy, held in zip(self._minis, state.contexts, state.held, strict=True):
            mini.release(held)
            copy.output_tokens = ctx.output_tokens
            mini.policy.on_request_finished(copy)

    def clear(self) -> None:
        """Forget everything: every miniature empty, every count zero."""
        for mini in self._minis:
            mini.clear()
        self.accesses = self.seen = self._window_accesses = 0
        self._recent_hits = [0.0] * len(self._minis)
        self._recent_accesses = 0.0
        self.windows = 0
        self._wins = [[0.0] * len(self._minis) for _ in self._minis]
        self._total_wins = [[0] * len(self._minis) for _ in self._minis]
        self._key_accesses = {}
        self._key_hits = [{} for _ in self._minis]
        self._sum_sq = 0
        self._sum_cross = [0] * len(self._minis)

    # --------------------------------------------------------------- reading
    def estimates(self) -> dict[str, ShadowEstimate]:
        """Every candidate's estimate, by name."""
        out = {}
        recent = self._recent_accesses
        for i, mini in enumerate(self._minis):
            out[mini.label] = ShadowEstimate(
                name=mini.label,
                hit_ratio=self._corrected(i, mini.hits),
                recent_hit_ratio=self._recent_hits[i] / recent if recent else 0.0,
                hits=mini.hits,
                accesses=self.accesses,
                capacity=mini.policy.cache_capacity,
                sample_hit_ratio=mini.hits / self.accesses if self.accesses else 0.0,
            )
        return out

    @property
    def recent_accesses(self) -> float:
        """The decayed number of sampled accesses behind the recent estimates."""
        return self._recent_accesses

    def paired(self, challenger: int, incumbent: int) -> tuple[float, float]:
        """Recent (decayed) accesses ``challenger`` hit and ``incumbent`` missed, and the reverse.

        The candidates see the same sampled accesses, so comparing them on the accesses where
        they disagree (a sign test) is far less noisy than comparing two hit ratios.
        """
        return self._wins[challenger][incumbent], self._wins[incumbent][challenger]

    def paired_total(self, challenger: int, incumbent: int) -> tuple[int, int]:
        """:meth:`paired` since the start, undecayed: the long-run evidence."""
        return self._total_wins[challenger][incumbent], self._total_wins[incumbent][challenger]

    def hit_ratios(self) -> dict[str, float]:
        """Estimated hit ratio since the start (corrected for the draw), by candidate name."""
        return {name: est.hit_ratio for name, est in self.estimates().items()}

    def sample_hit_ratios(self) -> dict[str, float]:
        """Hits over sampled accesses since the start (uncorrected), by candidate name."""
        sampled = self.accesses
        return {mini.label: mini.hits / sampled if sampled else 0.0 for mini in self._minis}

    def recent_hit_ratios(self) -> dict[str, float]:
        """Estimated hit ratio over the decayed recent windows, by candidate name."""
        recent = self._recent_accesses
        return {
            mini.label: hits / recent if recent else 0.0
            for mini, hits in zip(self._minis, self._recent_hits, strict=True)
        }

    def stats(self) -> dict[str, float]:
        """Flat gauges (``shadow_<name>_hit_ratio`` ...) for stats and metrics exporters."""
        out: dict[str, float] = {
            "shadow_rate": self.rate,
            "shadow_capacity": float(self.shadow_capacity),
            "shadow_accesses": float(self.accesses),
        }
        for name, est in self.estimates().items():
            out[f"shadow_{name}_hit_ratio"] = est.hit_ratio
            out[f"shadow_{name}_recent_hit_ratio"] = est.recent_hit_ratio
        return out


__all__ = [
    "PROTOCOLS",
    "ShadowEstimate",
    "ShadowEvaluator",
    "copy_context",
    "refresh_context",
    "sample_hash",
    "sampling_rate",
    "scaled_params",
]
