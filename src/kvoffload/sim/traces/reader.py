"""Streaming trace reader: lines -> JSON -> a format's record -> an interned TraceRequest.

Lines are parsed one at a time, so a trace never has to fit in memory twice. A malformed
line raises :class:`TraceFormatError` naming the file, the line and what is wrong; with
``skip_bad_lines=True`` it is counted and skipped instead (a line too long to be a record,
or a corrupt compressed file, always stops the read).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from kvoffload._checks import check_int
from kvoffload.sim.records import BlockIdInterner, Trace, TraceRequest
from kvoffload.sim.traces.base import BadRecord, ReaderState, TraceFormat, TraceFormatError
from kvoffload.sim.traces.io import DEFAULT_MAX_LINE_BYTES, iter_lines, open_trace_binary
from kvoffload.sim.traces.registry import (
    TRACE_FORMAT_REGISTRY,
    detect_trace_format,
    get_trace_format,
    trace_format_choices,
)

DEFAULT_BLOCK_TOKENS = 512


#: One line that turns a CSV trace (a header row naming the JSON fields; ``hash_ids`` a
#: quoted JSON list) into JSON Lines: numbers and lists are read as JSON, the rest as text.
CSV_TO_JSONL = (
    'python -c "import csv, json, sys; [print(json.dumps({k: json.loads(v) if v[:1] in '
    "'[-.0123456789' else v for k, v in row.items() if v})) for row in "
    'csv.DictReader(sys.stdin)]" < trace.csv > trace.jsonl'
)
CSV_NOT_READ = (
    "this looks like a CSV file; traces are JSON Lines (one JSON object per line) and CSV is "
    f"not read. Convert it (header row of field names, hash_ids as a quoted JSON list): "
    f"{CSV_TO_JSONL}"
)


def _looks_like_csv(text: str) -> bool:
    """A first line that is not JSON but is comma-separated and not a JSON object or list."""
    stripped = text.strip()
    return "," in stripped and not stripped.startswith(("{", "["))


class MixedBlockIdWarning(UserWarning):
    """A trace writes the same block id both as a number and as a string (two blocks)."""


def _last_block_tokens(input_tokens: int, num_blocks: int, block_tokens: int, field: str) -> int:
    low, high = block_tokens * (num_blocks - 1) + 1, block_tokens * num_blocks
    if not low <= input_tokens <= high:
        raise BadRecord(
            f"'{field}' = {input_tokens} does not fit {num_blocks} blocks of {block_tokens} "
            f"tokens (expected {low}..{high}; is the block size right?)"
        )
    return input_tokens - block_tokens * (num_blocks - 1)


def _twin(text: str) -> int | None:
    """The number a string block id spells exactly (``"1"`` -> ``1``; ``"01"`` -> ``None``)."""
    if text.lstrip("-").isdigit():
        number = int(text)
        return number if str(number) == text else None
    return None


class TraceReader:
    """Iterates a trace file's requests lazily; block ids are interned as they stream by.

    Args:
        path: a JSONL file, optionally gzip/zstd-compressed.
        fmt: ``"auto"`` or a registered format name (:func:`trace_format_choices`).
        block_tokens: tokens per block; default: the format's (512 for Mooncake and generic
            traces, the ``chunk_size`` field for LMCache logs).
        skip_bad_lines: count malformed lines (:attr:`skipped_lines`) instead of raising.
        max_requests: stop after this many requests (``None`` = all).
        max_line_bytes: longest line accepted; a longer one stops the read with an error.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fmt: str = "auto",
        block_tokens: int | None = None,
        skip_bad_lines: bool = False,
        max_requests: int | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        if not isinstance(fmt, str):
            raise TypeError(f"trace format must be a string, got {type(fmt).__name__}")
        self._format: TraceFormat | None = None
        if fmt != "auto":
            try:
                self._format = get_trace_format(fmt)
            except ValueError:
                close = TRACE_FORMAT_REGISTRY.suggest(fmt)
                hint = f" Did you mean '{close}'?" if close is not None else ""
                raise ValueError(
                    f"unknown trace format '{fmt}'.{hint} Choose one of {trace_format_choices()}"
                ) from None
        if block_tokens is not None:
            check_int("block_tokens", block_tokens, 1, why=" (tokens per block)", or_none=True)
        if max_requests is not None:
            check_int("max_requests", max_requests, 1, or_none=True)
        check_int("max_line_bytes", max_line_bytes, 1)
        self.path = os.fspath(path)
        self.fmt = fmt
        self.skip_bad_lines = skip_bad_lines
        self.max_requests = max_requests
        self.max_line_bytes = max_line_bytes
        self.interner = BlockIdInterner()
        self.skipped_lines = 0
        self.first_error: str | None = None
        self._state = ReaderState(block_tokens)
        self._first_time: float | None = None
        self._last_time = 0.0
        self._warned_mixed_ids = False
        self._read_a_record = False

    @property
    def block_tokens(self) -> int:
        """Tokens per block (known once the first record has been read)."""
        return self._state.block_tokens or DEFAULT_BLOCK_TOKENS

    @property
    def detected_format(self) -> str:
        """The format in use (``"auto"`` until the first record is read)."""
        return self._format.name if self._format is not None else "auto"

    def __iter__(self) -> Iterator[TraceRequest]:
        if os.path.isdir(self.path):  # open() would say only "[Errno 21] Is a directory"
            raise ValueError(
                f"trace path '{self.path}' is a directory; give a trace file (JSON Lines, "
                "optionally gzip- or zstd-compressed)"
            )
        produced = 0
        with open_trace_binary(self.path) as stream:
            for line_no, line in iter_lines(stream, self.path, self.max_line_bytes):
                if not line.strip():
                    continue
                try:
                    request = self._parse_line(line, line_no)
                except BadRecord as exc:
                    error = TraceFormatError(self.path, line_no, str(exc))
                    if not self.skip_bad_lines:
                        raise error from None
                    self.skipped_lines += 1
                    self.first_error = self.first_error or str(error)
                    continue
                yield request
                produced += 1
                if self.max_requests is not None and produced >= self.max_requests:
                    break
        self._warn_mixed_ids()

    def _parse_line(self, line: bytes, line_no: int) -> TraceRequest:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRecord(
                f"not valid UTF-8 (byte {exc.start + 1} of the line: {exc.reason})"
            ) from None
        try:
            obj: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            if not self._read_a_record and _looks_like_csv(text):
                raise BadRecord(CSV_NOT_READ) from None
            raise BadRecord(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
        fmt = self._format
        state = self._state
        if fmt is None:
            fmt = self._format = detect_trace_format(obj)
            if state.block_tokens is None:
                state.block_tokens = fmt.default_block_tokens
        elif state.block_tokens is None:
            state.block_tokens = fmt.default_block_tokens
        record = fmt.parse(obj, state)
        block_tokens = state.block_tokens
        if block_tokens is None:
            raise BadRecord(f"the {fmt.name} format set no block size: pass block_tokens")
        raw_ids = record.block_ids
        input_tokens = record.input_tokens
        if input_tokens is None:
            input_tokens = block_tokens * len(raw_ids)
        last = _last_block_tokens(input_tokens, len(raw_ids), block_tokens, fmt.length_field)
        if record.timestamp_s is None:
            timestamp_s = self._last_time
        else:
            if self._first_time is None:
                self._first_time = record.timestamp_s
            timestamp_s = record.timestamp_s - self._first_time
        self._last_time = timestamp_s
        self._read_a_record = True
        return TraceRequest(
            req_id=record.request_id if record.request_id is not None else str(line_no),
            timestamp_s=timestamp_s,
            block_ids=self.interner.intern(raw_ids),
            input_tokens=input_tokens,
            output_tokens=record.output_tokens,
            last_block_tokens=last,
            session_id=record.session_id,
            category=record.category,
            line=line_no,
        )

    def _warn_mixed_ids(self) -> None:
        """Warn once when a number and its string (``1`` / ``"1"``) are both block ids.

        One pass over the unique ids when the read ends, and only when both kinds occur, so
        the per-line cost is nil.
        """
        if self._warned_mixed_ids:
            return
        pair = _first_twin(self.interner.raw_ids())
        if pair is not None:
            self._warned_mixed_ids = True
            warnings.warn(
                f"{self.path}: block ids {pair[0]!r} and {pair[1]!r} both appear; a number and "
                "a string are two different blocks (warned once per trace)",
                MixedBlockIdWarning,
                stacklevel=3,
            )


def _first_twin(raw_ids: Iterable[Hashable]) -> tuple[int, str] | None:
    ids = list(raw_ids)
    strings = [raw for raw in ids if type(raw) is str]
    if not strings or len(strings) == len(ids):
        return None
    numbers = {raw for raw in ids if type(raw) is int}
    for text in strings:
        twin = _twin(text)
        if twin is not None and twin in numbers:
            return twin, text
    return None


def load_trace(
    path: str | os.PathLike[str],
    fmt: str = "auto",
    block_tokens: int | None = None,
    skip_bad_lines: bool = False,
    max_requests: int | None = None,
) -> Trace:
    """Read a whole trace into memory (see :class:`TraceReader` for the arguments)."""
    reader = TraceReader(path, fmt, block_tokens, skip_bad_lines, max_requests)
    requests = list(reader)
    if not requests:
        detail = f" ({reader.skipped_lines} bad lines skipped)" if reader.skipped_lines else ""
        raise ValueError(f"{reader.path}: the trace has no requests{detail}")
    return Trace(
        requests=requests,
        block_tokens=reader.block_tokens,
        num_unique_blocks=len(reader.interner),
        source=reader.path,
        skipped_lines=reader.skipped_lines,
        first_skip_error=reader.first_error,
    )


__all__ = [
    "CSV_NOT_READ",
    "CSV_TO_JSONL",
    "DEFAULT_BLOCK_TOKENS",
    "MixedBlockIdWarning",
    "TraceReader",
    "load_trace",
]
