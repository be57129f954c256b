"""RESP2 framing of the two hot commands on a socket that redis-py connected.

Why not redis-py's pipeline for records: with hiredis installed, redis-py packs each command
with ``hiredis.pack_command``, which first copies a memoryview argument to ``bytes`` and then
copies it again into the packed command (``docs/benchmarks.md`` has the rate), and it reads
a reply in 64 KiB ``recv_into`` calls fed through hiredis's own buffer into a new ``bytes``
object. Here a record's payload is sent from the host
slot where it lies, after a small header, and a reply's bulk string is received straight into
the caller's buffer.

Connecting, AUTH / SELECT / TLS, socket deadlines, the pool and the retry policy stay
redis-py's: this module only frames bytes and parses the replies of ``SET``, ``PEXPIRE`` and
``GETRANGE`` (simple strings, errors, integers, bulk strings and nils, RESP2 and RESP3's null).
Anything else on the wire is a protocol error and the caller drops the connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

try:  # the same error classes (OOM, READONLY, LOADING, ...) redis-py's parsers give
    from redis._parsers import BaseParser as _BaseParser
except ImportError:  # pragma: no cover - older redis-py layouts
    _BaseParser = None  # type: ignore[assignment,misc]

CRLF = b"\r\n"
_LINE_LIMIT = 64 * 1024  # replies to SET / GETRANGE never carry a longer line
_READ_CHUNK = 4096  # a line read takes at most this much of what follows into our buffer


def bulk(arg: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def set_head(name: bytes, value_bytes: int, with_px: bool) -> bytes:
    """``SET name <value> NX [PX ms]`` up to the value's own bytes (``$len\\r\\n`` included)."""
    return b"*%d\r\n$3\r\nSET\r\n%s$%d\r\n" % (6 if with_px else 4, bulk(name), value_bytes)


def set_tail(px: int | None) -> bytes:
    """What follows a ``SET`` value: its CRLF, then ``NX`` and ``PX ms``."""
    if px is None:
        return b"\r\n$2\r\nNX\r\n"
    return b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n" + bulk(str(px).encode())


def get_command(name: bytes, px: int, limit: int) -> bytes:
    """``PEXPIRE name ms`` (a hit refreshes the TTL; left out when ``px`` is 0), then
    ``GETRANGE name 0 limit``: at most ``limit + 1`` bytes of the value.

    Why not ``GETEX``: its reply is the whole value, whatever its length, so a value far
    larger than a record costs that much to receive before it can be refused. With the range,
    ``limit + 1`` bytes back says the value is longer than ``limit``, and no more is sent.
    """
    get = b"*4\r\n$8\r\nGETRANGE\r\n%s$1\r\n0\r\n%s" % (bulk(name), bulk(b"%d" % limit))
    if px:
        return b"*3\r\n$7\r\nPEXPIRE\r\n%s%s" % (bulk(name), bulk(b"%d" % px)) + get
    return get


def parse_error(text: str) -> Exception:
    """An error reply as the exception redis-py would have given (``raise_on_error=False``)."""
    if _BaseParser is not None:
        return _BaseParser.parse_error(text)  # type: ignore[no-any-return,no-untyped-call]
    return ResponseError(text)  # pragma: no cover


class Replies:
    """Reads replies from one socket; bulk strings go straight into the caller's buffer.

    Socket errors come out as redis-py's ``ConnectionError`` / ``TimeoutError`` (so its retry
    policy and the tier's back-off treat them as they treat redis-py's own).
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray(_LINE_LIMIT)
        self._view = memoryview(self._buf)
        self._lo = 0
        self._hi = 0

    @property
    def buffered(self) -> int:
        """Bytes read from the socket and not yet consumed (0 after a complete exchange)."""
        return self._hi - self._lo

    def _recv_into(self, view: memoryview) -> int:
        try:
            got = self._sock.recv_into(view)
        except TimeoutError as exc:  # socket.timeout is TimeoutError since Python 3.10
            raise RedisTimeoutError("Timeout reading from socket") from exc
        except OSError as exc:
            raise RedisConnectionError(f"Error while reading from socket: {exc}") from exc
        if not got:
            raise RedisConnectionError("Connection closed by server.")
        return got

    def _fill(self) -> None:
        """Read more into the buffer: at most ``_READ_CHUNK`` bytes, so that most of a bulk
        string that follows is received straight into its own buffer, not copied from ours."""
        if self._lo == self._hi:
            self._lo = self._hi = 0
        elif self._lo:  # keep the unread part at the start of the buffer
            kept = self._hi - self._lo
            self._buf[:kept] = self._view[self._lo : self._hi]
            self._lo, self._hi = 0, kept
        if self._hi == len(self._buf):
            raise RedisConnectionError("Protocol error: reply line too long")
        self._hi += self._recv_into(self._view[self._hi : self._hi + _READ_CHUNK])

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(CRLF, self._lo, self._hi)
            if end >= 0:
                line = bytes(self._view[self._lo : end])
                self._lo = end + 2
                return line
            self._fill()

    def _exactly(self, view: memoryview) -> None:
        have = min(len(view), self._hi - self._lo)
        view[:have] = self._view[self._lo : self._lo + have]
        self._lo += have
        filled = have
        while filled < len(view):
            filled += self._recv_into(view[filled:])

    def _crlf(self) -> None:
        while self._hi - self._lo < 2:  # read with what follows: the next reply's line
            self._fill()
        if self._view[self._lo : self._lo + 2] != CRLF:
            raise RedisConnectionError("Protocol error: bulk string not followed by CRLF")
        self._lo += 2

    def reply(self, buffer_for: Callable[[int], memoryview] | None = None) -> Any:
        """The next reply: ``True`` for ``+OK``, ``None`` for a nil, an ``int``, an exception
        object for an error reply, or a bulk string: a view from ``buffer_for(length)`` (valid
        until that buffer is reused) or, without ``buffer_for``, ``bytes``."""
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return True if rest == b"OK" else rest
        if kind == b"$":
            try:
                size = int(rest)
            except ValueError:
                raise RedisConnectionError(f"Protocol error: bad length {rest!r}") from None
            if size < 0:
                return None
            view = buffer_for(size) if buffer_for is not None else memoryview(bytearray(size))
            if len(view) != size:
                raise ValueError(f"buffer_for({size}) gave {len(view)} bytes")
            self._exactly(view)
            self._crlf()
            return view if buffer_for is not None else bytes(view)
        if kind == b"-":
            return parse_error(rest.decode("utf-8", "replace"))
        if kind == b":":
            try:
                return int(rest)
            except ValueError:
                raise RedisConnectionError(f"Protocol error: bad integer {rest!r}") from None
        if kind == b"_" and not rest:
            return None
        raise RedisConnectionError(f"Protocol error: unexpected reply {line[:32]!r}")
