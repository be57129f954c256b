"""The RESP reply reader of the Redis tier's direct path, on a socket pair (no server)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

pytest.importorskip("redis")

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvoffload.tiers.redis import wire


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5.0)
    yield ours, theirs
    ours.close()
    theirs.close()


def send_slowly(sock: socket.socket, data: bytes, step: int) -> threading.Thread:
    """Send ``data`` in ``step``-byte writes from a thread (replies split anywhere)."""

    def run() -> None:
        for start in range(0, len(data), step):
            sock.sendall(data[start : start + step])

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("step", [1, 5, 1 << 20])
def test_every_reply_kind_parses_wherever_the_bytes_are_split(
    pair: tuple[socket.socket, socket.socket], step: int
) -> None:
    ours, theirs = pair
    big = bytes(range(256)) * 300  # over the 64 KiB line buffer
    stream = (
        b"+OK\r\n$-1\r\n_\r\n:7\r\n-OOM command not allowed when used memory > 'maxmemory'.\r\n"
        b"$5\r\nhello\r\n+QUEUED\r\n$%d\r\n%s\r\n$0\r\n\r\n" % (len(big), big)
    )
    thread = send_slowly(theirs, stream, step)
    replies = wire.Replies(ours)
    buffer = memoryview(bytearray(len(big) + 10))
    asked: list[int] = []

    def buffer_for(size: int) -> memoryview:
        asked.append(size)
        return buffer[:size]

    assert replies.reply() is True
    assert replies.reply() is None
    assert replies.reply() is None
    assert replies.reply() == 7
    error = replies.reply()
    assert isinstance(error, ResponseError) and "maxmemory" in str(error)
    assert type(error).__name__ == "OutOfMemoryError"  # the class redis-py's parsers give
    assert replies.reply() == b"hello"
    assert replies.reply() == b"QUEUED"
    view = replies.reply(buffer_for)
    assert isinstance(view, memoryview) and bytes(view) == big
    assert bytes(replies.reply(buffer_for)) == b""
    assert asked == [len(big), 0]
    assert replies.buffered == 0
    thread.join()


@pytest.mark.parametrize(
    "stream",
    [
        b"?what\r\n",  # unknown reply type
        b"$abc\r\n",  # bad length
        b":x\r\n",  # bad integer
        b"$3\r\nabcXY",  # bulk string not followed by CRLF
        b"+" + b"x" * (70 * 1024),  # a line longer than any reply to SET / GETEX
    ],
)
def test_garbage_is_a_protocol_error(
    pair: tuple[socket.socket, socket.socket], stream: bytes
) -> None:
    ours, theirs = pair
    thread = send_slowly(theirs, stream, 1 << 20)
    with pytest.raises(RedisConnectionError, match="Protocol error"):
        wire.Replies(ours).reply()
    thread.join()


def test_a_closed_connection_mid_reply_is_a_connection_error(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = pair
    theirs.sendall(b"$100\r\n" + b"x" * 40)
    theirs.close()
    with pytest.raises(RedisConnectionError, match="closed"):
        wire.Replies(ours).reply()


def test_a_silent_server_is_a_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _theirs = pair
    ours.settimeout(0.05)
    with pytest.raises(RedisTimeoutError):
        wire.Replies(ours).reply()


def test_commands_are_resp_arrays() -> None:
    head = wire.set_head(b"k:1", 3, with_px=True)
    assert head + b"abc" + wire.set_tail(1500) == (
        b"*6\r\n$3\r\nSET\r\n$3\r\nk:1\r\n$3\r\nabc\r\n$2\r\nNX\r\n$2\r\nPX\r\n$4\r\n1500\r\n"
    )
    assert wire.set_head(b"k", 0, with_px=False) + wire.set_tail(None) == (
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\nNX\r\n"
    )
    getrange = b"*4\r\n$8\r\nGETRANGE\r\n$1\r\nk\r\n$1\r\n0\r\n$3\r\n100\r\n"
    pexpire = b"*3\r\n$7\r\nPEXPIRE\r\n$1\r\nk\r\n$2\r\n10\r\n"
    assert wire.get_command(b"k", 10, 100) == pexpire + getrange
    assert wire.get_command(b"k", 0, 100) == getrange
