"""A seeded generator of realistic prefix-cache traffic, the simulator's embedded default.

The model (every knob is a :class:`WorkloadConfig` field):

* **Shared system prompts.** ``system_prompts`` prompts, lengths log-normal around
  ``system_prompt_tokens``; every activity picks one with Zipf(``system_prompt_zipf``)
  popularity, so a few prompts are very hot and most are cold.
* **Activities** arrive as a Poisson process (``arrival="poisson"``) at ``activity_rate``
  per second, or bursty (``arrival="bursty"``: a two-state process that spends
  ``burst_fraction`` of the time at ``burst_factor`` times the quiet rate, same mean). Each
  is, with the ``*_weight`` probabilities:

  - a **chat session**: ``1 + Geometric`` turns (mean ``chat_turns``); each turn sends the
    whole conversation so far plus a new user message, after a log-normal think time
    (median ``think_time_s``) following the previous answer;
  - a **one-off request**: a system prompt plus a long unique document (RAG, summarise),
    never reused: the pollution that makes LRU far from optimal;
  - an **agent / tool loop**: a long tool-schema prompt (one of ``agent_prompts``), then
    ``1 + Geometric`` steps (mean ``agent_steps``) that each append a tool result after a
    short tool latency (median ``tool_latency_s``).

Ids are prefix-chained as in Mooncake's traces: a request's blocks are its context's full
blocks (same ids as before) followed by fresh ids; the partially filled last block of one
turn is a *different* block in the next turn (its content grew), so it gets a new id. Equal
prefixes therefore have equal ids, and an id always has the same predecessor.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import json
import math
import os
import random
from array import array
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import IO, cast

from kvoffload.sim.records import Trace, TraceRequest
from kvoffload.sim.traces import MOONCAKE_BLOCK_TOKENS


@dataclass(frozen=True)
class WorkloadConfig:
    """Knobs of the generator; the defaults give a mix where LRU is far from optimal."""

    seed: int = 0
    requests: int = 1500
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    arrival: str = "poisson"  # or "bursty"
    activity_rate: float = 1.5  # new activities (sessions, one-offs, agent loops) per second
    burst_factor: float = 6.0
    burst_fraction: float = 0.15
    burst_cycle_s: float = 120.0  # mean length of one quiet + burst cycle
    system_prompts: int = 50
    system_prompt_zipf: float = 1.2
    system_prompt_tokens: int = 1000
    chat_weight: float = 0.5
    oneoff_weight: float = 0.44
    agent_weight: float = 0.06
    chat_turns: float = 4.0
    user_tokens: int = 1500
    answer_tokens: int = 800
    think_time_s: float = 90.0
    document_tokens: int = 15000
    agent_prompts: int = 6
    agent_prompt_tokens: int = 6000
    agent_steps: float = 5.0
    tool_tokens: int = 900
    tool_latency_s: float = 10.0
    length_sigma: float = 0.8  # spread (log-normal sigma) of every token length
    # Above this many requests the load grows with the request count (see load_scale).
    reference_requests: int = 1500

    def __post_init__(self) -> None:
        _check_config(self)

    @property
    def load_scale(self) -> float:
        """How much busier than ``activity_rate`` the generated server is.

        A bigger trace is a busier server over the same time window (as a production trace
        of one hour is), not the same few users for longer: with the rate fixed, the blocks
        waiting for a reuse stay about as many as the users active at once while the unique
        blocks grow with the request count, so at 200,000 requests only 0.4% of them would
        ever be live and every policy would tie with OPT. So above ``reference_requests``
        the activity rate and the numbers of system and agent prompts grow in proportion
        (``reference_requests=0``: never); up to it, the workload is exactly as configured.
        """
        if self.reference_requests <= 0 or self.requests <= self.reference_requests:
            return 1.0
        return self.requests / self.reference_requests


def _check_config(cfg: WorkloadConfig) -> None:
    if cfg.requests < 1:
        raise ValueError(f"workload requests must be >= 1, got {cfg.requests}")
    if cfg.block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {cfg.block_tokens}")
    if cfg.arrival not in ("poisson", "bursty"):
        raise ValueError(f"arrival must be 'poisson' or 'bursty', got {cfg.arrival!r}")
    positive = (
        "activity_rate",
        "burst_factor",
        "burst_cycle_s",
        "system_prompt_tokens",
        "user_tokens",
        "answer_tokens",
        "document_tokens",
        "agent_prompt_tokens",
        "tool_tokens",
    )
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"workload {name} must be > 0, got {getattr(cfg, name)}")
    if cfg.reference_requests < 0:
        raise ValueError(f"workload reference_requests must be >= 0, got {cfg.reference_requests}")
    for name in ("system_prompts", "agent_prompts"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"workload {name} must be >= 1, got {getattr(cfg, name)}")
    non_negative = (
        "system_prompt_zipf",
        "chat_weight",
        "oneoff_weight",
        "agent_weight",
        "think_time_s",
        "tool_latency_s",
        "length_sigma",
    )
    for name in non_negative:
        if getattr(cfg, name) < 0:
            raise ValueError(f"workload {name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.chat_weight + cfg.oneoff_weight + cfg.agent_weight <= 0:
        raise ValueError("at least one of chat_weight, oneoff_weight, agent_weight must be > 0")
    if not 0 <= cfg.burst_fraction < 1:
        raise ValueError(f"burst_fraction must be in [0, 1), got {cfg.burst_fraction}")
    if cfg.chat_turns < 1 or cfg.agent_steps < 1:
        raise ValueError("chat_turns and agent_steps are means of at least 1")


class _Context:
    """A token sequence as blocks: ids of its full blocks and its total token count."""

    __slots__ = ("full_ids", "tokens")

    def __init__(self, full_ids: list[int], tokens: int) -> None:
        self.full_ids = full_ids
        self.tokens = tokens


class _Builder:
    """Turns context extensions into prefix-chained block ids (fresh ids for new content)."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._next_id = 0

    def fresh(self, count: int) -> list[int]:
        start = self._next_id
        self._next_id += count
        return list(range(start, start + count))

    def new_context(self, tokens: int) -> _Context:
        """A context of brand-new content (a system prompt)."""
        return _Context(self.fresh(tokens // self.block_tokens), tokens)

    def prompt(self, ctx: _Context, new_tokens: int) -> tuple[list[int], int, _Context]:
        """Blocks of ``ctx`` + ``new_tokens`` tokens: (ids, prompt tokens, prompt context)."""
        bt = self.block_tokens
        total = ctx.tokens + new_tokens
        num_blocks = -(-total // bt)
        kept = ctx.full_ids[: min(len(ctx.full_ids), num_blocks)]
        ids = kept + self.fresh(num_blocks - len(kept))
        return ids, total, _Context(ids[: total // bt], total)

    @staticmethod
    def extend(ctx: _Context, tokens: int) -> _Context:
        """``ctx`` plus ``tokens`` generated tokens (their blocks get ids when next sent)."""
        return _Context(ctx.full_ids, ctx.tokens + tokens)


def _scaled(count: int, scale: float) -> int:
    return count if scale == 1.0 else max(count, round(count * scale))


class _Sampler:
    """The random draws of the model, from one seeded RNG."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.system_prompts = _scaled(cfg.system_prompts, cfg.load_scale)
        self.agent_prompts = _scaled(cfg.agent_prompts, cfg.load_scale)
        weights = [
            1.0 / (rank**cfg.system_prompt_zipf) for rank in range(1, self.system_prompts + 1)
        ]
        self._prompt_cdf = list(itertools.accumulate(weights))

    def tokens(self, median: float) -> int:
        return max(1, round(median * math.exp(self.rng.gauss(0.0, self.cfg.length_sigma))))

    def wait(self, median: float) -> float:
        if median <= 0:
            return 0.0
        return median * math.exp(self.rng.gauss(0.0, 1.0))

    def count(self, mean: float) -> int:
        """1 + Geometric with the given mean (>= 1)."""
        if mean <= 1:
            return 1
        p = 1.0 / mean
        return 1 + int(math.log(1.0 - self.rng.random()) / math.log(1.0 - p))

    def system_prompt(self) -> int:
        return bisect.bisect_left(self._prompt_cdf, self.rng.random() * self._prompt_cdf[-1])

    def kind(self) -> str:
        cfg = self.cfg
        return self.rng.choices(
            ("chat", "oneoff", "agent"), (cfg.chat_weight, cfg.oneoff_weight, cfg.agent_weight)
        )[0]


def _arrivals(cfg: WorkloadConfig, rng: random.Random) -> Iterable[float]:
    """Activity start times: Poisson, or a two-state bursty process with the same mean rate."""
    t = 0.0
    rate = cfg.activity_rate * cfg.load_scale
    if cfg.arrival == "poisson":
        while True:
            t += rng.expovariate(rate)
            yield t
    f = cfg.burst_fraction
    quiet_rate = rate / (1 - f + f * cfg.burst_factor)
    bursting = False
    phase_end = rng.expovariate(1.0 / (cfg.burst_cycle_s * (1 - f)))
    while True:
        rate = quiet_rate * cfg.burst_factor if bursting else quiet_rate
        step = rng.expovariate(rate)
        if t + step < phase_end:
            t += step
            yield t
            continue
        t = phase_end  # memoryless: restart the draw in the next phase
        bursting = not bursting and f > 0
        mean = cfg.burst_cycle_s * (f if bursting else 1 - f)
        phase_end = t + rng.expovariate(1.0 / mean)


def generate_workload(cfg: WorkloadConfig | None = None) -> Trace:
    """Generate ``cfg.requests`` requests (the earliest ones of the simulated time line)."""
    cfg = cfg or WorkloadConfig()
    sample = _Sampler(cfg)
    build = _Builder(cfg.block_tokens)
    system_prompts: dict[int, _Context] = {}
    agent_prompts: dict[int, _Context] = {}
    requests: list[tuple[float, int, TraceRequest]] = []  # max-heap via negated time
    counter = itertools.count()

    def shared(cache: dict[int, _Context], index: int, median: int) -> _Context:
        if index not in cache:
            cache[index] = build.new_context(sample.tokens(median))
        return cache[index]

    def emit(
        t: float, ctx: _Context, new_tokens: int, out: int, sid: str | None, kind: str
    ) -> _Context:
        ids, total, prompt_ctx = build.prompt(ctx, new_tokens)
        n = next(counter)
        request = TraceRequest(
            req_id=f"r{n}",
            timestamp_s=t,
            block_ids=ids,
            input_tokens=total,
            output_tokens=out,
            last_block_tokens=total - cfg.block_tokens * (len(ids) - 1),
            session_id=sid,
            category=kind,
        )
        # Keep only the `requests` earliest: a bounded max-heap on time.
        item = (-t, -n, request)
        if len(requests) < cfg.requests:
            heapq.heappush(requests, item)
        elif item > requests[0]:
            heapq.heapreplace(requests, item)
        return build.extend(prompt_ctx, out)

    def horizon() -> float:
        return -requests[0][0] if len(requests) >= cfg.requests else math.inf

    for activity, start in enumerate(_arrivals(cfg, sample.rng)):
        if start > horizon():
            break
        kind = sample.kind()
        sid = f"{kind}-{activity}"
        if kind == "oneoff":
            base = shared(system_prompts, sample.system_prompt(), cfg.system_prompt_tokens)
            emit(
                start,
                base,
                sample.tokens(cfg.document_tokens),
                sample.tokens(cfg.answer_tokens),
                None,
                kind,
            )
            continue
        if kind == "chat":
            ctx = shared(system_prompts, sample.system_prompt(), cfg.system_prompt_tokens)
            steps, median_new, median_wait = cfg.chat_turns, cfg.user_tokens, cfg.think_time_s
        else:
            index = sample.rng.randrange(sample.agent_prompts)
            ctx = shared(agent_prompts, index, cfg.agent_prompt_tokens)
            steps, median_new, median_wait = cfg.agent_steps, cfg.tool_tokens, cfg.tool_latency_s
        t = start
        for step in range(sample.count(steps)):
            if t > horizon():
                break
            new = sample.tokens(cfg.user_tokens if step == 0 else median_new)
            answer = sample.tokens(cfg.answer_tokens)
            ctx = emit(t, ctx, new, answer, sid, kind)
            t += sample.wait(median_wait)
    ordered = sorted(requests, key=lambda item: (-item[0], -item[1]))
    reqs = [item[2] for item in ordered]
    start = reqs[0].timestamp_s
    for request in reqs:  # the trace starts at 0, as Mooncake's do
        request.timestamp_s -= start
    trace = Trace(
        requests=reqs,
        block_tokens=cfg.block_tokens,
        num_unique_blocks=0,
        source=f"generated (seed={cfg.seed}, requests={cfg.requests})",
    )
    _densify_ids(trace)
    return trace


def _densify_ids(trace: Trace) -> None:
    """Renumber block ids 0.. in first-use order (dropped late requests leave gaps).

    The map is an array of machine ints indexed by the old id (8 bytes per id, no dict
    entries), and every access to a block shares one int object (``dense``): the trace's
    memory stays a pointer per access plus one int per block.
    """
    top = max((max(r.block_ids) for r in trace.requests if r.block_ids), default=-1) + 1
    mapping = array("q", [-1]) * top
    dense: list[int] = []
    for request in trace.requests:
        ids = request.block_ids
        for i, block in enumerate(ids):
            new = mapping[block]
            if new < 0:
                new = mapping[block] = len(dense)
                dense.append(new)
            ids[i] = dense[new]
    trace.num_unique_blocks = len(dense)


def write_mooncake_jsonl(trace: Trace, out: IO[str], extra_fields: bool = True) -> int:
    """Write ``trace`` as Mooncake FAST'25 JSONL; return the number of lines.

    ``extra_fields`` adds ``session_id`` and ``category`` (readers that only know the four
    Mooncake fields ignore them; :mod:`kvoffload.sim.traces` reads them back).
    """
    lines = 0
    for request in trace.requests:
        record: dict[str, object] = {
            "timestamp": round(request.timestamp_s * 1000),
            "input_length": request.input_tokens,
            "output_length": request.output_tokens,
            "hash_ids": request.block_ids,
        }
        if extra_fields:
            if request.session_id is not None:
                record["session_id"] = request.session_id
            if request.category is not None:
                record["category"] = request.category
        out.write(json.dumps(record, separators=(", ", ": ")) + "\n")
        lines += 1
    return lines


def open_output(path: str | os.PathLike[str]) -> IO[str]:
    """Open ``path`` for writing text, compressing by extension (``.gz``, ``.zst``)."""
    name = os.fspath(path)
    if name.endswith(".gz"):
        import gzip

        return gzip.open(name, "wt", encoding="utf-8")
    if name.endswith(".zst"):
        try:
            import zstandard  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise ImportError(
                f"writing {name} needs the 'zstandard' package (pip install zstandard)"
            ) from None
        import io

        raw = open(name, "wb")  # noqa: SIM115 - owned by the returned wrapper
        writer = zstandard.ZstdCompressor().stream_writer(raw, closefd=True)
        return io.TextIOWrapper(cast(IO[bytes], writer), encoding="utf-8")
    return open(name, "w", encoding="utf-8")


def config_as_dict(cfg: WorkloadConfig) -> dict[str, object]:
    """The knobs as a JSON-ready dict."""
    return asdict(cfg)


__all__ = [
    "WorkloadConfig",
    "config_as_dict",
    "generate_workload",
    "open_output",
    "write_mooncake_jsonl",
]
