"""The Redis tier's transport: pipelines, direct exchanges on pooled sockets, and back-off.

Every command the tier sends goes through here, so one place decides what a failure means: a
connection failure starts a back-off (per cluster node), during which the tier answers at once
instead of waiting on a dead server; a command's answer is never an exception raised, always
an answer or an exception object per name.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvoffload.tiers.redis.connect import RedisConnection

logger = logging.getLogger(__name__)

try:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError:  # pragma: no cover - only without the [redis] extra
    pass


class RedisTransport(RedisConnection):
    """Sending commands, with the back-off state (a base of ``RedisTier``)."""

    _backoff: dict[str | None, float]
    _down_until: dict[str | None, float]
    _direct: Any
    _direct_args: tuple[str, ...]
    _last_error: str
    _lock: threading.Lock
    _stats: collections.Counter[str]
    backoff_s: float
    max_backoff_s: float

    def _available(self, node: str | None = None) -> bool:
        """False while the server (or, on a cluster, ``node``) is in its back-off."""
        return time.monotonic() >= self._down_until.get(node, 0.0)

    def _note_failure(self, exc: BaseException, node: str | None = None) -> None:
        with self._lock:
            self._stats["connection_errors"] += 1
            self._last_error = f"{node or 'server'}: {type(exc).__name__}: {exc}"
            backoff = self._backoff.get(node, self.backoff_s)
            self._down_until[node] = time.monotonic() + backoff
            self._backoff[node] = min(backoff * 2, self.max_backoff_s)
        logger.warning(
            "redis tier %s: %s unavailable (%s); backing off for %.2f s",
            self._redacted(),
            node or "server",
            exc,
            backoff,
        )

    def _note_success(self, node: str | None = None) -> None:
        if node in self._down_until:
            with self._lock:
                self._down_until.pop(node, None)
                self._backoff.pop(node, None)
                if not self._down_until:
                    self._last_error = ""

    def _pipelined(
        self, names: Sequence[bytes], add: Callable[[Any, bytes], object], per_name: int = 1
    ) -> list[Any]:
        """One answer per name (an exception object for a failed command), never raising.

        ``add`` queues ``per_name`` commands for a name; its answer is the last one's, or the
        first failure among them. On a cluster the commands are grouped by node and each node
        gets its own pipeline, so a node that is down fails only its own keys (redis-py fails a
        whole cluster pipeline).
        """
        if not self._is_cluster:
            return self._pipeline_group(None, names, add, per_name)
        groups: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            node = self._client.get_node_from_key(name)
            groups.setdefault(node.name, []).append(i)
        answers: list[Any] = [None] * len(names)
        for node_name, indices in groups.items():
            part = self._pipeline_group(node_name, [names[i] for i in indices], add, per_name)
            for i, answer in zip(indices, part, strict=True):
                answers[i] = answer
        return answers

    def _pipeline_group(
        self,
        node: str | None,
        names: Sequence[bytes],
        add: Callable[[Any, bytes], object],
        per_name: int = 1,
    ) -> list[Any]:
        def talk() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                add(pipe, name)
            return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

        answers = self._exchange(node, len(names) * per_name, talk)
        if per_name == 1:
            return answers
        groups = [answers[i : i + per_name] for i in range(0, len(answers), per_name)]
        return [
            next((a for a in group if isinstance(a, BaseException)), group[-1]) for group in groups
        ]

    def _direct_exchange(self, count: int, talk: Callable[[Any], list[Any]]) -> list[Any]:
        """``talk(connection)`` on one connection of the pool: ``count`` answers, never raising.

        redis-py's retry policy applies; a connection that failed or was left in an unknown
        state is dropped, not reused.
        """
        pool: Any = self._direct

        def on_connection() -> list[Any]:
            conn = pool.get_connection(*self._direct_args)
            try:  # redis-py's connections (5.0+) always have a retry policy, maybe of 0 retries
                return conn.retry.call_with_retry(  # type: ignore[no-any-return]
                    functools.partial(talk, conn), lambda _error: conn.disconnect()
                )
            except BaseException:
                conn.disconnect()  # its state is unknown: never reused
                raise
            finally:
                pool.release(conn)

        return self._exchange(None, count, on_connection)

    def _exchange(self, node: str | None, count: int, talk: Callable[[], list[Any]]) -> list[Any]:
        """``talk()``'s ``count`` answers, or as many of the exception it raised; a connection
        failure starts the back-off of the server (or cluster ``node``), during which nothing
        is sent."""
        if not self._available(node):
            return [_Unavailable(f"{node or self._redacted()} is backing off")] * count
        try:
            answers = talk()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            self._note_failure(exc, node)
            return [exc] * count
        except RedisError as exc:
            return [exc] * count
        if any(isinstance(a, (RedisConnectionError, RedisTimeoutError)) for a in answers):
            self._note_failure(next(a for a in answers if isinstance(a, BaseException)), node)
        else:
            self._note_success(node)
        return answers


class _Unavailable(Exception):
    """The answer for a key whose server or node is in its back-off (no command was sent)."""


def _reason_of(exc: BaseException) -> str:
    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError, _Unavailable)):
        return "unavailable"
    text = str(exc)
    if "OOM" in text or type(exc).__name__ == "OutOfMemoryError":  # redis-py strips the "OOM"
        return "server_full"
    return "server_error"


__all__ = ["RedisError", "RedisTransport"]
