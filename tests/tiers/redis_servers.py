"""Real Redis servers for the Redis-tier tests: the CI ones (``.ci/redis_servers.sh``) and
throwaway ones a test may kill and restart.

A test that needs a server and finds none is skipped with the reason, except under
``CI=true``, where CI promised the servers: there the missing server is a failure.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

START_HINT = 'start them with: eval "$(bash .ci/redis_servers.sh start)"'


def unavailable(reason: str) -> None:
    """Skip (or, under CI=true, fail) the calling test."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}")
    pytest.skip(reason)


def require_redis_binaries() -> None:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        unavailable("redis-server / redis-cli are not installed (apt-get install redis-server)")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(cluster: bool = False) -> int:
    """A free loopback port; for a cluster node, one whose bus port (port + 10000) is free
    and below 65536 too (an ephemeral port above 55535 has no valid bus port)."""
    if not cluster:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 40000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


def cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=10
    )
    return out.stdout


def wait_ping(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "PONG" in cli(port, "ping"):
            return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not start")


class RedisProcess:
    """One redis-server on loopback that a test owns: it can kill it and start it again."""

    def __init__(self, port: int | None = None, *extra: str, cluster: bool = False) -> None:
        require_redis_binaries()
        self.port = port or free_port(cluster)
        self.extra = extra
        self.dir = Path(tempfile.mkdtemp(prefix="kvoffload-redis-test-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ping(self.port)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterProcesses:
    """A throwaway 3-node Redis Cluster (no replicas) a test may stop nodes of."""

    def __init__(self) -> None:
        self.nodes = [
            RedisProcess(
                None,
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                "--cluster-require-full-coverage",
                "no",
                cluster=True,
            )
            for _ in range(3)
        ]
        for node in self.nodes:
            node.extra = (*node.extra, "--cluster-config-file", str(node.dir / "nodes.conf"))

    def start(self) -> RedisClusterProcesses:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            timeout=30,
            check=True,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in cli(n.port, "cluster", "info") for n in self.nodes):
                return self
            time.sleep(0.1)
        raise RuntimeError("throwaway cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def ci_url(variable: str) -> str:
    """The URL in ``variable`` (set by ``.ci/redis_servers.sh``) of a server that answers."""
    url = os.environ.get(variable)
    if not url:
        unavailable(f"{variable} is not set; {START_HINT}")
    import redis

    try:
        if variable.endswith("CLUSTER_URL"):
            from redis.cluster import RedisCluster

            client = RedisCluster.from_url(url, socket_connect_timeout=2)
        else:
            client = redis.Redis.from_url(url, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:
        unavailable(f"no Redis server answers at {variable} ({exc}); {START_HINT}")
    return str(url)
