"""Opening a trace (plain, gzip or zstd, told by the first bytes) and reading bounded lines.

Lines are read as bytes, at most ``max_line_bytes`` at a time, and decoded one by one, so a
file with no newlines (``/dev/zero``) fails at once instead of filling memory, and a bad
UTF-8 byte is reported at its own line (and can be skipped) rather than wherever a decoder
buffer happened to end. A corrupt or truncated compressed file is one
:class:`TraceFormatError` naming the line it was reading.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from typing import IO, Any, cast

from kvoffload.sim.traces.base import TraceFormatError

#: Longest line accepted by default (bytes, newline excluded). A Mooncake record of a 128k-token
#: prompt is about 2 KB; an LMCache record of a million tokens in 256-token chunks about 90 KB.
DEFAULT_MAX_LINE_BYTES = 16 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def open_trace_binary(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for reading bytes, decompressing gzip or zstd transparently."""
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        magic = raw.peek(4)[:4]
        if magic.startswith(_GZIP_MAGIC):
            return cast(IO[bytes], gzip.GzipFile(fileobj=raw))
        if magic.startswith(_ZSTD_MAGIC):
            return _zstd_stream(raw, os.fspath(path))
        return raw
    except BaseException:
        raw.close()
        raise


def open_trace_text(path: str | os.PathLike[str]) -> IO[str]:
    """Open ``path`` for reading UTF-8 text, decompressing gzip or zstd transparently."""
    return io.TextIOWrapper(open_trace_binary(path), encoding="utf-8")


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
    return cast(IO[bytes], io.BufferedReader(reader))


def _decompression_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error]
    for module_name in ("compression.zstd", "zstandard"):
        try:
            module = __import__(module_name, fromlist=["ZstdError"])
        except ImportError:
            continue
        error = getattr(module, "ZstdError", None)
        if isinstance(error, type) and issubclass(error, BaseException):
            errors.append(error)
    return tuple(errors)


def iter_lines(
    stream: IO[bytes], path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes]]:
    """``(line number, line without its newline)`` for each line of ``stream``, 1-based.

    Raises :class:`TraceFormatError` for a line longer than ``max_line_bytes`` and for a
    stream that cannot be read or decompressed; neither can be skipped.
    """
    errors = _decompression_errors()
    line_no = 0
    while True:
        try:
            line = stream.readline(max_line_bytes + 2)
        except errors as exc:
            detail = str(exc) or type(exc).__name__
            raise TraceFormatError(
                path,
                line_no + 1,
                f"cannot read the file (corrupt or truncated?): {type(exc).__name__}: {detail}",
            ) from None
        if not line:
            return
        line_no += 1
        content = line.rstrip(b"\r\n")
        if len(content) > max_line_bytes:
            raise TraceFormatError(
                path,
                line_no,
                f"line is longer than {max_line_bytes:,} bytes; is this a JSON Lines trace?",
            )
        yield line_no, content


__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "iter_lines",
    "open_trace_binary",
    "open_trace_text",
]
