"""What a trace format is: a name, a detector, a parser to a named record, block-size facts.

A format module subclasses :class:`TraceFormat` and is registered by name in
:data:`kvoffload.sim.traces.TRACE_FORMAT_REGISTRY` (one line in ``traces/__init__.py``, or an
entry point in the group ``kvoffload.trace_formats`` for an out-of-tree format). The reader
does everything else: opening and decompressing, splitting and decoding lines, JSON, block-id
interning, timestamps relative to the first record, and the last block's token count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import Any, ClassVar, NamedTuple


class TraceFormatError(ValueError):
    """A trace line that cannot be used; ``str()`` reads ``path:line: what is wrong``."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


class BadRecord(ValueError):
    """Raised by a format's parser for a record it cannot use; the reader adds file and line."""


class TraceRecord(NamedTuple):
    """One parsed record, before interning (what :meth:`TraceFormat.parse` returns).

    A named tuple: as cheap to build as the positional tuple it replaces, read by name.

    Attributes:
        block_ids: the prompt's block ids as the file writes them (ints or strings).
        timestamp_s: arrival time in seconds on the file's clock (``None``: the previous
            record's time).
        input_tokens: prompt tokens (``None``: every block full).
        output_tokens: generated tokens (0 when unknown).
        request_id / session_id / category: as the file says, when it does.
    """

    block_ids: list[Hashable]
    timestamp_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int = 0
    request_id: str | None = None
    session_id: str | None = None
    category: str | None = None


class ReaderState:
    """What a parser may read and set while one file is read (the block size, so far)."""

    __slots__ = ("block_tokens",)

    def __init__(self, block_tokens: int | None) -> None:
        self.block_tokens = block_tokens


class TraceFormat(ABC):
    """One JSON Lines trace format.

    Class attributes:
        name: the registered name (``--trace-format``).
        default_block_tokens: tokens per block when the user gives none (``None``: the parser
            sets ``state.block_tokens`` from the records, as LMCache's ``chunk_size``).
        length_field: the field that gives the prompt length, for error messages.
        detect_priority: ``auto`` tries formats from the highest priority down (ties: in
            registration order); a generic format that claims many records stays low.
    """

    name: ClassVar[str]
    default_block_tokens: ClassVar[int | None] = 512
    length_field: ClassVar[str] = "input_length"
    detect_priority: ClassVar[int] = 0

    @abstractmethod
    def detect(self, obj: dict[str, Any]) -> bool:
        """True when the record ``obj`` (the file's first) is in this format."""

    @abstractmethod
    def parse(self, obj: dict[str, Any], state: ReaderState) -> TraceRecord:
        """The record ``obj`` as a :class:`TraceRecord`; :class:`BadRecord` if unusable."""


__all__ = ["BadRecord", "ReaderState", "TraceFormat", "TraceFormatError", "TraceRecord"]
