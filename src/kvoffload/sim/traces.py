"""Streaming readers for prefix-cache traces: Mooncake FAST'25, LMCache lookup logs, generic.

Every format is JSON Lines, optionally gzip- or zstd-compressed (detected from the file's
first bytes, not its name). Lines are parsed one at a time, so a trace never has to fit in
memory twice. A malformed line raises :class:`TraceFormatError` naming the file, the line
and what is wrong; with ``skip_bad_lines=True`` it is counted and skipped instead.

Formats (``fmt``; ``"auto"`` picks one from the first record's fields):

* ``mooncake``: ``{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}``;
  512 tokens per block, the last block holds ``input_length - 512 * (len(hash_ids) - 1)``.
* ``lmcache``: ``{"timestamp": s, "request_id": .., "chunk_size": n, "seq_len": n,
  "chunk_hashes": [..]}`` (LMCache's lookup-hash log); ``seq_len`` sizes the last chunk.
* ``hash_ids``: ``{"hash_ids": [..]}`` plus optional ``timestamp`` (s), ``input_length``,
  ``output_length``, ``session_id``; every block full unless ``input_length`` says otherwise.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
from collections.abc import Callable, Hashable, Iterator
from typing import IO, Any, cast

from kvoffload.sim.records import BlockIdInterner, Trace, TraceRequest

MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_BLOCK_TOKENS = 512
TRACE_FORMATS = ("auto", "mooncake", "lmcache", "hash_ids")

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class TraceFormatError(ValueError):
    """A trace line that cannot be used; ``str()`` reads ``path:line: what is wrong``."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


class _BadRecord(ValueError):
    """Raised by a record parser; the reader adds the file and line."""


def open_trace_text(path: str | os.PathLike[str]) -> IO[str]:
    """Open ``path`` for reading text, decompressing gzip or zstd transparently."""
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        magic = raw.peek(4)[:4] if hasattr(raw, "peek") else b""
        if magic.startswith(_GZIP_MAGIC):
            stream: IO[bytes] = gzip.GzipFile(fileobj=raw)  # type: ignore[assignment]
        elif magic.startswith(_ZSTD_MAGIC):
            stream = _zstd_stream(raw, str(path))
        else:
            stream = raw
        return io.TextIOWrapper(stream, encoding="utf-8")
    except BaseException:
        raw.close()
        raise


def _zstd_stream(raw: IO[bytes], path: str) -> IO[bytes]:
    try:
        from compression import zstd  # type: ignore[import-not-found, unused-ignore]  # 3.14+

        return zstd.ZstdFile(raw)  # type: ignore[no-any-return, unused-ignore]
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ImportError(
            f"{path} is zstd-compressed; install the 'zstandard' package to read it "
            "(pip install zstandard) or decompress it first"
        ) from None
    reader: Any = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
    return cast(IO[bytes], reader)


# ---------------------------------------------------------------------------- field checks


def _require(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise _BadRecord(f"missing field '{name}'")
    return obj[name]


def _as_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise _BadRecord(f"'{name}' must be an integer, got {value!r}")
    if value < minimum:
        raise _BadRecord(f"'{name}' must be >= {minimum}, got {value}")
    return int(value)


def _as_time(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _BadRecord(f"'{name}' must be a finite number, got {value!r}")
    return float(value)


def _as_block_ids(value: Any, name: str) -> list[Hashable]:
    if not isinstance(value, list):
        raise _BadRecord(f"'{name}' must be a list of block ids, got {type(value).__name__}")
    if not value:
        raise _BadRecord(f"'{name}' is empty: a request needs at least one block")
    for i, block_id in enumerate(value):
        if isinstance(block_id, bool) or not isinstance(block_id, (int, str)):
            raise _BadRecord(f"'{name}'[{i}] must be an integer or a string, got {block_id!r}")
    return value


def _optional_str(obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _BadRecord(f"'{name}' must be a string, got {value!r}")
    return str(value)


def _last_block_tokens(input_tokens: int, num_blocks: int, block_tokens: int, field: str) -> int:
    low, high = block_tokens * (num_blocks - 1) + 1, block_tokens * num_blocks
    if not low <= input_tokens <= high:
        raise _BadRecord(
            f"'{field}' = {input_tokens} does not fit {num_blocks} blocks of {block_tokens} "
            f"tokens (expected {low}..{high}; is the block size right?)"
        )
    return input_tokens - block_tokens * (num_blocks - 1)


# ---------------------------------------------------------------------------- record parsers

_Parsed = tuple[float | None, list[Hashable], int | None, int, str | None, str | None, str | None]
# (timestamp_s, raw ids, input_tokens or None = all blocks full, output_tokens,
#  request id, session id, category)


def _parse_mooncake(obj: dict[str, Any], state: _ReaderState) -> _Parsed:
    timestamp_ms = _as_time(_require(obj, "timestamp"), "timestamp")
    input_tokens = _as_int(_require(obj, "input_length"), "input_length", 1)
    output_tokens = _as_int(obj.get("output_length", 0), "output_length", 0)
    ids = _as_block_ids(_require(obj, "hash_ids"), "hash_ids")
    return (
        timestamp_ms / 1000.0,
        ids,
        input_tokens,
        output_tokens,
        _optional_str(obj, "request_id"),
        _optional_str(obj, "session_id"),
        _optional_str(obj, "category"),
    )


def _parse_lmcache(obj: dict[str, Any], state: _ReaderState) -> _Parsed:
    ids = _as_block_ids(_require(obj, "chunk_hashes"), "chunk_hashes")
    if "chunk_size" in obj:
        chunk_size = _as_int(obj["chunk_size"], "chunk_size", 1)
        if state.block_tokens is None:
            state.block_tokens = chunk_size
        elif chunk_size != state.block_tokens:
            raise _BadRecord(
                f"'chunk_size' = {chunk_size} differs from the trace's block size "
                f"{state.block_tokens}; one trace must use one chunk size"
            )
    elif state.block_tokens is None:
        raise _BadRecord("missing field 'chunk_size' (or pass the block size explicitly)")
    seq_len = obj.get("seq_len")
    input_tokens = None
    if seq_len is not None:
        seq = _as_int(seq_len, "seq_len", 1)
        block_tokens = state.block_tokens
        assert block_tokens is not None  # set above
        if seq <= block_tokens * (len(ids) - 1):
            raise _BadRecord(
                f"'seq_len' = {seq} is too short for {len(ids)} chunks of {block_tokens} tokens"
            )
        input_tokens = min(seq, block_tokens * len(ids))  # tokens past the last chunk: unhashed
    timestamp = obj.get("timestamp")
    return (
        None if timestamp is None else _as_time(timestamp, "timestamp"),
        ids,
        input_tokens,
        0,
        _optional_str(obj, "request_id"),
        _optional_str(obj, "session_id"),
        _optional_str(obj, "category"),
    )


def _parse_hash_ids(obj: dict[str, Any], state: _ReaderState) -> _Parsed:
    ids = _as_block_ids(_require(obj, "hash_ids"), "hash_ids")
    timestamp = obj.get("timestamp")
    input_length = obj.get("input_length")
    return (
        None if timestamp is None else _as_time(timestamp, "timestamp"),
        ids,
        None if input_length is None else _as_int(input_length, "input_length", 1),
        _as_int(obj.get("output_length", 0), "output_length", 0),
        _optional_str(obj, "request_id"),
        _optional_str(obj, "session_id"),
        _optional_str(obj, "category"),
    )


_PARSERS: dict[str, Callable[[dict[str, Any], _ReaderState], _Parsed]] = {
    "mooncake": _parse_mooncake,
    "lmcache": _parse_lmcache,
    "hash_ids": _parse_hash_ids,
}


def detect_format(obj: dict[str, Any]) -> str:
    """The format a record belongs to, from its fields."""
    if "chunk_hashes" in obj:
        return "lmcache"
    if "hash_ids" in obj and "input_length" in obj:
        return "mooncake"
    if "hash_ids" in obj:
        return "hash_ids"
    raise _BadRecord(
        "cannot tell the trace format: expected 'hash_ids' (Mooncake / generic) or "
        f"'chunk_hashes' (LMCache); fields present: {sorted(obj)[:8]}"
    )


class _ReaderState:
    __slots__ = ("block_tokens", "first_time", "fmt", "last_time")

    def __init__(self, fmt: str, block_tokens: int | None) -> None:
        self.fmt = fmt
        self.block_tokens = block_tokens
        self.first_time: float | None = None
        self.last_time = 0.0


class TraceReader:
    """Iterates a trace file's requests lazily; block ids are interned as they stream by.

    Args:
        path: a JSONL file, optionally gzip/zstd-compressed.
        fmt: one of :data:`TRACE_FORMATS`.
        block_tokens: tokens per block; default 512 for Mooncake and generic traces, the
            ``chunk_size`` field for LMCache logs.
        skip_bad_lines: count malformed lines (:attr:`skipped_lines`) instead of raising.
        max_requests: stop after this many requests (``None`` = all).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fmt: str = "auto",
        block_tokens: int | None = None,
        skip_bad_lines: bool = False,
        max_requests: int | None = None,
    ) -> None:
        if fmt not in TRACE_FORMATS:
            raise ValueError(f"unknown trace format '{fmt}'; choose one of {list(TRACE_FORMATS)}")
        if block_tokens is not None and block_tokens < 1:
            raise ValueError(f"block size must be a positive number of tokens, got {block_tokens}")
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        self.path = os.fspath(path)
        self.fmt = fmt
        self.skip_bad_lines = skip_bad_lines
        self.max_requests = max_requests
        self.interner = BlockIdInterner()
        self.skipped_lines = 0
        self.first_error: str | None = None
        self._state = _ReaderState(fmt, block_tokens)

    @property
    def block_tokens(self) -> int:
        """Tokens per block (known once the first record has been read)."""
        return self._state.block_tokens or DEFAULT_BLOCK_TOKENS

    @property
    def detected_format(self) -> str:
        """The format in use (``"auto"`` until the first record is read)."""
        return self._state.fmt

    def __iter__(self) -> Iterator[TraceRequest]:
        produced = 0
        with open_trace_text(self.path) as text:
            line_no = 0
            while True:
                try:
                    line = text.readline()
                except (UnicodeDecodeError, EOFError, OSError) as exc:
                    raise TraceFormatError(self.path, line_no + 1, f"unreadable: {exc}") from exc
                if not line:
                    return
                line_no += 1
                if not line.strip():
                    continue
                try:
                    request = self._parse_line(line, line_no)
                except _BadRecord as exc:
                    error = TraceFormatError(self.path, line_no, str(exc))
                    if not self.skip_bad_lines:
                        raise error from None
                    self.skipped_lines += 1
                    self.first_error = self.first_error or str(error)
                    continue
                yield request
                produced += 1
                if self.max_requests is not None and produced >= self.max_requests:
                    return

    def _parse_line(self, line: str, line_no: int) -> TraceRequest:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _BadRecord(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise _BadRecord(f"expected a JSON object, got {type(obj).__name__}")
        state = self._state
        if state.fmt == "auto":
            state.fmt = detect_format(obj)
        if state.block_tokens is None and state.fmt != "lmcache":
            state.block_tokens = (
                MOONCAKE_BLOCK_TOKENS if state.fmt == "mooncake" else DEFAULT_BLOCK_TOKENS
            )
        timestamp, raw_ids, input_tokens, output_tokens, req_id, session, category = _PARSERS[
            state.fmt
        ](obj, state)
        block_tokens = state.block_tokens
        assert block_tokens is not None  # resolved above or by the LMCache parser
        field = "seq_len" if state.fmt == "lmcache" else "input_length"
        if input_tokens is None:
            input_tokens = block_tokens * len(raw_ids)
        last = _last_block_tokens(input_tokens, len(raw_ids), block_tokens, field)
        if timestamp is None:
            timestamp_s = state.last_time
        else:
            if state.first_time is None:
                state.first_time = timestamp
            timestamp_s = timestamp - state.first_time
        state.last_time = timestamp_s
        return TraceRequest(
            req_id=req_id if req_id is not None else str(line_no),
            timestamp_s=timestamp_s,
            block_ids=self.interner.intern(raw_ids),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            last_block_tokens=last,
            session_id=session,
            category=category,
            line=line_no,
        )


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
    "DEFAULT_BLOCK_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "TRACE_FORMATS",
    "TraceFormatError",
    "TraceReader",
    "detect_format",
    "load_trace",
    "open_trace_text",
]
