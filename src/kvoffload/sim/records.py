"""The in-memory trace model every reader, generator, bound and replay shares.

Block ids are interned to dense integers (0, 1, 2, ... in order of first appearance) when a
trace is read, whatever the source used (ints, hex strings): equal ids stay equal, the
count of unique blocks is free, and the replay can map ids to offload keys with one list.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class TraceRequest:
    """One request of a trace: the prefix-chained blocks of its prompt and its timing.

    Attributes:
        req_id: the trace's request id, or ``"<line>"`` when the format has none.
        timestamp_s: arrival time in seconds, relative to the trace start.
        block_ids: dense block ids of the prompt, head first.
        input_tokens: prompt tokens (the last block may be partial).
        output_tokens: generated tokens (0 when unknown); used only by overlapped replay.
        last_block_tokens: tokens in the last block (``block_tokens`` when it is full).
        session_id: conversation / agent session, when the trace says so.
        category: request kind (``"chat"``, ``"agent"``, ...), when the trace says so.
        line: 1-based line of the request in its file (0 for generated requests).
    """

    req_id: str
    timestamp_s: float
    block_ids: list[int]
    input_tokens: int
    output_tokens: int
    last_block_tokens: int
    session_id: str | None = None
    category: str | None = None
    line: int = 0

    def has_partial_tail(self, block_tokens: int) -> bool:
        """True when the last block holds fewer than ``block_tokens`` tokens."""
        return bool(self.block_ids) and self.last_block_tokens < block_tokens


class BlockIdInterner:
    """Maps a source's block ids (any hashable) to dense ints in first-seen order."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[Hashable, int] = {}

    def intern(self, raw_ids: list[Hashable]) -> list[int]:
        """Dense ids for ``raw_ids``, assigning new ones to ids never seen before."""
        ids = self._ids
        out = []
        for raw in raw_ids:
            dense = ids.get(raw)
            if dense is None:
                dense = ids[raw] = len(ids)
            out.append(dense)
        return out

    def __len__(self) -> int:
        return len(self._ids)

    def raw_ids(self) -> Iterator[Hashable]:
        """The source's ids, in first-seen order."""
        return iter(self._ids)


@dataclass
class Trace:
    """A whole trace in memory: the requests in file (arrival) order plus what describes them.

    Attributes:
        requests: the requests, in the order they are replayed.
        block_tokens: tokens per full block.
        num_unique_blocks: distinct block ids (dense ids are ``0 .. num_unique_blocks - 1``).
        source: where it came from (a path, or ``"generated (seed=0)"``).
        skipped_lines: malformed lines skipped with ``skip_bad_lines``.
        first_skip_error: the first skipped line's error (``path:line: what``), if any.
    """

    requests: list[TraceRequest]
    block_tokens: int
    num_unique_blocks: int
    source: str = ""
    skipped_lines: int = 0
    first_skip_error: str | None = None
    _accesses: int | None = field(default=None, repr=False)

    @property
    def block_accesses(self) -> int:
        """Total block accesses (the flattened sequence's length)."""
        if self._accesses is None:
            self._accesses = sum(len(r.block_ids) for r in self.requests)
        return self._accesses

    @property
    def total_tokens(self) -> int:
        """Prompt tokens covered by the requests' blocks."""
        bt = self.block_tokens
        return sum(
            (len(r.block_ids) - 1) * bt + r.last_block_tokens for r in self.requests if r.block_ids
        )

    def flat_block_ids(self) -> list[int]:
        """Every request's blocks, concatenated in replay order (libCacheSim's view)."""
        out: list[int] = []
        for request in self.requests:
            out.extend(request.block_ids)
        return out

    def iter_block_tokens(self) -> Iterator[int]:
        """Token count of each block of :meth:`flat_block_ids`, in the same order."""
        bt = self.block_tokens
        for request in self.requests:
            n = len(request.block_ids)
            for i in range(n):
                yield request.last_block_tokens if i == n - 1 else bt

    def describe(self) -> dict[str, object]:
        """Summary figures for reports (JSON-ready)."""
        return {
            "source": self.source,
            "requests": len(self.requests),
            "block_accesses": self.block_accesses,
            "unique_blocks": self.num_unique_blocks,
            "block_tokens": self.block_tokens,
            "skipped_lines": self.skipped_lines,
            "first_skip_error": self.first_skip_error,
        }


__all__ = ["BlockIdInterner", "Trace", "TraceRequest"]
