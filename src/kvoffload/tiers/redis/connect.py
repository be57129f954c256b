"""The Redis tier's connection: the client, the checks at start, and the direct socket pool.

Why apart: how the tier reaches the server (URL, ACL credentials, TLS, cluster, a pool whose
sockets records can go over directly) is one job; what it sends is the others'.
"""

from __future__ import annotations

import inspect
import re
import socket
from typing import Any

from kvoffload._checks import redact_url

try:
    import redis as _redis
    from redis.exceptions import AuthenticationError, RedisError
except ImportError:  # pragma: no cover - only without the [redis] extra
    _redis = None  # type: ignore[assignment]

try:
    from redis.connection import AbstractConnection as _AbstractConnection
except ImportError:  # pragma: no cover - redis-py < 5: records go through pipelines
    _AbstractConnection = None  # type: ignore[assignment,misc]

_NOT_AS_IS = frozenset(b":{}")  # bytes a namespace written as is never holds
_GLOB_SPECIAL = re.compile(rb"[][*?\\{}]")


def namespace_text(namespace: bytes) -> str:
    """How ``namespace`` appears in record names: as is when it is ASCII without a colon or
    a brace, otherwise ``hex:`` and its hex digits.

    Why the marker: the colon it holds never occurs in an as-is form, so no two namespaces
    share names (``b"\\xa0\\xa1"`` and the text ``"a0a1"`` once did, and each side deleted
    the other's records). Braces are left to the hash tag (``{ns}``), so ``"{x}"`` untagged
    and ``"x"`` tagged differ too. Other as-is names are unchanged: their records stay readable.
    """
    if namespace.isascii() and not _NOT_AS_IS.intersection(namespace):
        return namespace.decode()
    return "hex:" + namespace.hex()


def glob_escape(text: bytes) -> bytes:
    """``text`` matching only itself in a ``SCAN MATCH`` pattern (Redis glob: ``* ? [ ] \\``
    are special; braces escaped too, which a hash tag puts in a name)."""
    return _GLOB_SPECIAL.sub(rb"\\\g<0>", text)


def redis_available() -> bool:
    """True when redis-py is importable (the ``kvoffload[redis]`` extra)."""
    return _redis is not None


class RedisConnection:
    """Connecting to the server and checking it (a base of ``RedisTier``)."""

    _client: Any
    _describe: str
    _is_cluster: bool
    _key_prefix: bytes
    ttl_ms: int

    def _connect(
        self,
        url: str,
        username: str | None,
        password: str | None,
        ssl_ca_certs: str | None,
        ssl_certfile: str | None,
        ssl_keyfile: str | None,
        op_timeout_s: float,
        workers: int,
    ) -> Any:
        if not isinstance(url, str) or "://" not in url:
            raise ValueError(f"url must look like redis://host:port/db, got {url!r}")
        kwargs: dict[str, Any] = {
            "socket_timeout": op_timeout_s,
            "socket_connect_timeout": op_timeout_s,
        }
        if username is not None:
            kwargs["username"] = username
        if password is not None:
            kwargs["password"] = password
        tls = {
            "ssl_ca_certs": ssl_ca_certs,
            "ssl_certfile": ssl_certfile,
            "ssl_keyfile": ssl_keyfile,
        }
        if any(tls.values()):  # TLS files imply TLS: rediss:// selects redis-py's SSL connection
            if url.startswith("redis://"):
                url = "rediss://" + url[len("redis://") :]
            kwargs.update({k: v for k, v in tls.items() if v})
        if self._is_cluster:
            from redis.cluster import RedisCluster

            return RedisCluster.from_url(url, **kwargs)
        kwargs["max_connections"] = workers + 2
        return _redis.Redis.from_url(url, **kwargs)

    def _check_server(self) -> None:
        """Fail at start with a clear error: wrong password, unreachable, too old."""
        try:
            self._client.ping()
            probe = self._key_prefix + b"permission-probe"  # never a record's name
            self._client.getrange(probe, 0, 0)  # the ACL user may run what a get sends
            if self.ttl_ms:
                self._client.pexpire(probe, self.ttl_ms)
            if hasattr(self._client, "info") and not self._is_cluster:
                version = str(self._client.info("server").get("redis_version", "0"))
                major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
                if major_minor and major_minor < (6, 2):
                    raise ValueError(
                        f"the redis tier needs Redis 6.2+ (GETEX); {self._describe} runs {version}"
                    )
        except AuthenticationError as exc:
            raise PermissionError(
                f"redis tier: authentication failed at {self._redacted()}: {exc} "
                "(check username/password or the URL's user:password)"
            ) from exc
        except RedisError as exc:
            text = str(exc)
            refused = type(exc).__name__ == "NoPermissionError"  # redis-py strips "NOPERM"
            if refused or "NOAUTH" in text or "WRONGPASS" in text or "NOPERM" in text:
                raise PermissionError(
                    f"redis tier: the server at {self._redacted()} refused us: {text} "
                    "(give an ACL username and password allowed +set +getrange +pexpire "
                    "+exists +del +scan +strlen +ping +info)"
                ) from exc
            raise ConnectionError(f"redis tier: cannot reach {self._redacted()}: {text}") from exc

    def _direct_pool(self) -> tuple[Any, tuple[str, ...]]:
        """The client's pool, when records can go over its sockets directly (see :mod:`wire`),
        and the arguments its ``get_connection`` wants; ``(None, ())`` otherwise."""
        client = self._client
        if self._is_cluster or _AbstractConnection is None or not isinstance(client, _redis.Redis):
            return None, ()
        if getattr(client, "connection", None) is not None:  # single_connection_client
            return None, ()
        pool: Any = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        kwargs = getattr(pool, "connection_kwargs", None)
        if (
            not isinstance(cls, type)
            or not issubclass(cls, _AbstractConnection)
            or not isinstance(kwargs, dict)
            or kwargs.get("protocol") not in (None, 2, "2")
            or kwargs.get("cache") is not None
            or kwargs.get("cache_config") is not None
            or getattr(pool, "cache", None) is not None
        ):
            return None, ()
        try:  # redis-py < 5.3 wants a command name; later ones warn when given one
            param = inspect.signature(pool.get_connection).parameters.get("command_name")
        except (TypeError, ValueError):  # pragma: no cover
            param = None
        args = ("SET",) if param is not None and param.default is inspect.Parameter.empty else ()
        try:  # the connections must expose the socket they connected (redis-py's ``_sock``)
            conn = pool.get_connection(*args)
        except RedisError:  # pragma: no cover - the server answered _check_server just now
            return None, ()
        try:
            usable = isinstance(getattr(conn, "_sock", None), socket.socket)
        finally:
            pool.release(conn)
        return (pool, args) if usable else (None, ())

    def _redacted(self) -> str:
        return redact_url(self._describe)


__all__ = ["RedisConnection", "glob_escape", "namespace_text", "redis_available"]
