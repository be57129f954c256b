"""The Redis tier against real servers: the CI standalone (ACL user) and cluster servers from
``.ci/redis_servers.sh``, and throwaway servers these tests kill and restart."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis")

import redis

from kvoffload.tiers import BytearraySlotMemory, JobKind, Presence, TierResult
from kvoffload.tiers.redis import RecordCodec, RecordError, RedisTier

sys.path.insert(0, str(Path(__file__).parent))
from redis_servers import RedisClusterProcesses, RedisProcess, ci_url

SLOT = 4096
SRC = str(Path(__file__).resolve().parents[2] / "src")


def pattern(key: bytes, size: int = SLOT) -> bytes:
    """Bytes derived from the key, so a slot holding another key's bytes is caught."""
    seed = (key * (size // len(key) + 1))[:size]
    return bytes((b + i) % 256 for i, b in enumerate(seed[:64])) + seed[64:]


def fill(memory: BytearraySlotMemory, keys: list[bytes], slots: list[int]) -> None:
    for key, slot in zip(keys, slots, strict=True):
        memory.slot_view(slot)[:] = pattern(key, memory.slot_bytes)


def wait(tier: RedisTier, timeout: float = 10.0) -> list[TierResult]:
    assert tier.drain(timeout), "jobs still in flight after the deadline"
    return tier.poll()


def fresh_keys(n: int) -> list[bytes]:
    tag = uuid.uuid4().bytes
    return [tag + i.to_bytes(4, "big") for i in range(n)]


@pytest.fixture(scope="module")
def standalone_url() -> str:
    return ci_url("KVOFFLOAD_REDIS_URL")


@pytest.fixture(scope="module")
def cluster_url() -> str:
    return ci_url("KVOFFLOAD_REDIS_CLUSTER_URL")


@pytest.fixture(params=["standalone", "cluster"])
def tier(request: pytest.FixtureRequest) -> Iterator[RedisTier]:
    url = request.getfixturevalue(f"{request.param}_url")
    memory = BytearraySlotMemory(SLOT, 32)
    t = RedisTier(memory, url, cluster=request.param == "cluster", namespace="t", lookup="sync")
    yield t
    t.close()


def test_round_trip_is_byte_exact_and_counted(tier: RedisTier) -> None:
    assert (tier._direct is None) == tier._is_cluster  # standalone: the direct socket path
    keys = fresh_keys(16)
    fill(tier.memory, keys, list(range(16)))  # type: ignore[arg-type]
    assert tier.contains(keys) == [Presence.MISS] * 16
    put_id = tier.submit_put(keys, list(range(16)))
    (put,) = wait(tier)
    assert (put.job_id, put.kind, put.all_ok, put.nbytes) == (put_id, JobKind.PUT, True, 16 * SLOT)
    assert tier.contains(keys) == [Presence.HIT] * 16
    get_id = tier.submit_get(keys, list(range(16, 32)))
    (get,) = wait(tier)
    assert (get.job_id, get.all_ok, get.nbytes) == (get_id, True, 16 * SLOT)
    for i, key in enumerate(keys):
        assert bytes(tier.memory.slot_view(16 + i)) == pattern(key)
    assert tier.poll() == []  # each job exactly once
    assert tier.stats()["hits"] == 16


def test_records_are_immutable_nx(tier: RedisTier) -> None:
    (key,) = fresh_keys(1)
    tier.memory.slot_view(0)[:] = b"a" * SLOT
    tier.submit_put([key], [0])
    assert wait(tier)[0].all_ok
    tier.memory.slot_view(1)[:] = b"b" * SLOT
    tier.submit_put([key], [1])
    assert wait(tier)[0].all_ok  # already stored: success, nothing overwritten
    assert tier.stats()["records_existing"] == 1
    tier.submit_get([key], [2])
    assert wait(tier)[0].all_ok
    assert bytes(tier.memory.slot_view(2)) == b"a" * SLOT


def test_missing_key_between_lookup_and_get_is_a_miss_not_a_loop(standalone_url: str) -> None:
    memory = BytearraySlotMemory(SLOT, 4)
    tier = RedisTier(memory, standalone_url, namespace="t", lookup="sync")
    try:
        (key,) = fresh_keys(1)
        fill(memory, [key], [0])
        tier.submit_put([key], [0])
        wait(tier)
        assert tier.contains([key]) == [Presence.HIT]
        client = redis.Redis.from_url(standalone_url)
        assert client.delete(tier._name(key)) == 1  # the server evicts it (or it expires)
        tier.submit_get([key], [1])
        results = wait(tier)
        assert len(results) == 1 and results[0].ok == (False,)
        assert results[0].reasons == {0: "missing"}
        assert tier.contains([key]) == [Presence.MISS]  # negative verdict, no RETRY
        assert tier.poll() == []
    finally:
        tier.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "other_key", "other_namespace"])
def test_a_record_changed_on_the_server_is_rejected_counted_and_deleted(
    standalone_url: str, damage: str
) -> None:
    memory = BytearraySlotMemory(SLOT, 4)
    tier = RedisTier(memory, standalone_url, namespace="t", lookup="sync")
    client = redis.Redis.from_url(standalone_url)
    try:
        key, other = fresh_keys(2)
        fill(memory, [key, other], [0, 1])
        tier.submit_put([key, other], [0, 1])
        wait(tier)
        name = tier._name(key)
        record = bytearray(client.get(name))
        if damage == "flip":
            record[len(record) // 2] ^= 0x40
        elif damage == "truncate":
            record = record[:-100]
        elif damage == "other_key":
            record = bytearray(client.get(tier._name(other)))
        else:
            alien = RecordCodec(namespace=b"another-model")
            record = bytearray(alien.encode(key, memory.slot_view(0)))
        client.set(name, bytes(record))
        memory.slot_view(2)[:] = b"\0" * SLOT
        tier.submit_get([key], [2])
        (result,) = wait(tier)
        assert result.ok == (False,)
        expected = "corrupt" if damage in ("flip", "truncate") else "foreign"
        assert result.reasons == {0: expected}
        assert tier.stats()[f"rejected_{expected}"] == 1
        assert client.exists(name) == 0  # deleted, so nobody else is served it
        assert bytes(memory.slot_view(2)) == b"\0" * SLOT or damage != "flip"
    finally:
        tier.close()


def test_signed_records_keep_out_writers_without_the_secret(standalone_url: str) -> None:
    secret = b"s" * 32
    memory = BytearraySlotMemory(SLOT, 4)
    signer = RedisTier(memory, standalone_url, namespace="t", secret=secret, lookup="sync")
    intruder = RedisTier(memory, standalone_url, namespace="t", lookup="sync")
    other_secret = RedisTier(memory, standalone_url, namespace="t", secret=b"x" * 32)
    try:
        a, b, c = fresh_keys(3)
        fill(memory, [a, b, c], [0, 1, 2])
        intruder.submit_put([a], [0])  # unsigned record under a key the signer will read
        other_secret.submit_put([b], [1])  # signed with another secret
        signer.submit_put([c], [2])
        for t in (intruder, other_secret, signer):
            assert wait(t)[0].all_ok
        signer.submit_get([a, b, c], [3, 3, 3])
        (result,) = wait(signer)
        assert result.ok == (False, False, True)
        assert result.reasons == {0: "bad_signature", 1: "bad_signature"}
        assert bytes(memory.slot_view(3)) == pattern(c)
        intruder.submit_get([c], [3])  # a tier without the secret refuses signed records too
        assert wait(intruder)[0].reasons == {0: "bad_signature"}
    finally:
        for t in (signer, intruder, other_secret):
            t.close()


@pytest.mark.parametrize("ttl_ms", [0, 60_000])
def test_records_on_the_wire_are_the_codec_format_on_both_paths(
    standalone_url: str, ttl_ms: int
) -> None:
    """The direct socket path (standalone) and redis-py pipelines (here: a RESP3 client, which
    the direct path leaves alone) store the same bytes and read each other's records."""
    big = 256 * 1024  # several TCP segments and recv calls per record
    direct = RedisTier(BytearraySlotMemory(big, 8), standalone_url, namespace="w", ttl_ms=ttl_ms)
    resp3 = redis.Redis.from_url(standalone_url, protocol=3)
    piped = RedisTier(BytearraySlotMemory(big, 8), namespace="w", ttl_ms=ttl_ms, client=resp3)
    client = redis.Redis.from_url(standalone_url)
    try:
        assert direct._direct is not None and piped._direct is None
        keys = fresh_keys(8)
        fill(direct.memory, keys[:4], [0, 1, 2, 3])  # type: ignore[arg-type]
        fill(piped.memory, keys[4:], [4, 5, 6, 7])  # type: ignore[arg-type]
        direct.submit_put(keys[:4], [0, 1, 2, 3])
        piped.submit_put(keys[4:], [4, 5, 6, 7])
        assert wait(direct)[0].all_ok and wait(piped)[0].all_ok
        for key in keys:
            stored = client.get(direct._name(key))
            assert stored == direct.codec.encode(key, pattern(key, big))
            assert (client.pttl(direct._name(key)) > 0) == (ttl_ms > 0)
        direct.submit_get(keys[4:], [0, 1, 2, 3])  # records the other path wrote
        piped.submit_get(keys[:4], [4, 5, 6, 7])
        assert wait(direct)[0].all_ok and wait(piped)[0].all_ok
        for i in range(4):
            assert bytes(direct.memory.slot_view(i)) == pattern(keys[4 + i], big)
            assert bytes(piped.memory.slot_view(4 + i)) == pattern(keys[i], big)
        assert direct.stats()["stored"] == 4 and direct.stats()["hits"] == 4
    finally:
        direct.close()
        piped.close()


def test_server_errors_in_a_pipeline_fail_only_their_records() -> None:
    """An error reply (OOM under noeviction) is that record's reason; the records around it
    and the connection carry on."""
    server = RedisProcess(None, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction").start()
    try:
        size = 64 * 1024
        memory = BytearraySlotMemory(size, 64)
        tier = RedisTier(memory, server.url, namespace="t")
        keys = fresh_keys(64)
        fill(memory, keys, list(range(64)))
        tier.submit_put(keys, list(range(64)))
        (put,) = wait(tier)
        stored = [k for k, ok in zip(keys, put.ok, strict=True) if ok]
        assert 0 < len(stored) < len(keys)
        assert set(put.reasons.values()) == {"server_full"}
        assert tier.health().ok and tier.stats().get("connection_errors", 0) == 0
        memory.slot_view(0)[:] = b"\0" * size
        tier.submit_get(stored, [0] * len(stored))
        (get,) = wait(tier)
        assert get.all_ok
        assert bytes(memory.slot_view(0)) == pattern(stored[-1], size)
        tier.close()
    finally:
        server.close()


def test_codec_rejects_every_single_byte_flip() -> None:
    codec = RecordCodec(namespace=b"ns", secret=b"k" * 16)
    record = codec.encode(b"key", b"payload bytes")
    assert bytes(codec.payload_of(b"key", record)) == b"payload bytes"
    for i in range(len(record)):
        damaged = bytearray(record)
        damaged[i] ^= 0x01
        with pytest.raises(RecordError):
            codec.payload_of(b"key", bytes(damaged))


def test_wrong_password_is_a_clear_error_at_start(standalone_url: str) -> None:
    memory = BytearraySlotMemory(SLOT, 1)
    wrong = standalone_url.replace("@", "-wrong@", 1)
    with pytest.raises(PermissionError, match="authentication failed"):
        RedisTier(memory, wrong)
    with pytest.raises(PermissionError, match=r"\*\*\*"):  # the password is never printed
        RedisTier(memory, wrong)
    anonymous = "redis://" + standalone_url.split("@", 1)[1]
    with pytest.raises(PermissionError):
        RedisTier(memory, anonymous)


def test_unknown_answer_is_a_miss_after_the_deadline_never_a_loop() -> None:
    server = RedisProcess().start()
    try:
        memory = BytearraySlotMemory(SLOT, 2)
        tier = RedisTier(memory, server.url, namespace="t", lookup_deadline_ms=100)
        admin = redis.Redis.from_url(server.url)
        (key,) = fresh_keys(1)
        admin.execute_command("CLIENT", "PAUSE", "600", "ALL")  # the server stops answering
        assert tier.contains([key]) == [Presence.UNKNOWN]
        time.sleep(0.15)
        assert tier.contains([key]) == [Presence.MISS]  # deadline passed: a miss
        tier.close()
    finally:
        server.close()


def test_puts_beyond_the_inflight_bound_are_dropped_and_counted() -> None:
    server = RedisProcess().start()
    try:
        memory = BytearraySlotMemory(SLOT, 8)
        tier = RedisTier(memory, server.url, namespace="t", max_inflight_bytes=4 * SLOT)
        admin = redis.Redis.from_url(server.url)
        keys = fresh_keys(8)
        admin.execute_command("CLIENT", "PAUSE", "500", "WRITE")
        tier.submit_put(keys[:4], [0, 1, 2, 3])  # in flight until the pause ends
        time.sleep(0.05)
        tier.submit_put(keys[4:], [4, 5, 6, 7])  # over the bound: dropped at once
        results = {r.job_id: r for r in wait(tier)}
        first, second = results[1], results[2]
        assert first.all_ok
        assert second.ok == (False,) * 4
        assert set(second.reasons.values()) == {"backpressure"}
        assert tier.stats()["failed_backpressure"] == 4
        tier.close()
    finally:
        server.close()


def test_ttl_is_refreshed_by_a_hit() -> None:
    server = RedisProcess().start()
    try:
        memory = BytearraySlotMemory(SLOT, 2)
        tier = RedisTier(memory, server.url, namespace="t", ttl_ms=3000)
        admin = redis.Redis.from_url(server.url)
        (key,) = fresh_keys(1)
        tier.submit_put([key], [0])
        wait(tier)
        time.sleep(0.6)
        before = admin.pttl(tier._name(key))
        assert 0 < before <= 2500
        tier.submit_get([key], [1])
        assert wait(tier)[0].all_ok
        assert admin.pttl(tier._name(key)) > 2800  # GETEX PX: the hit restarted its clock
        tier.close()
    finally:
        server.close()


def test_server_killed_mid_pipeline_and_restarted() -> None:
    """Both instances keep answering while it is down (misses, failed jobs, no exception),
    reconnect on their own after the restart, and never serve a torn block."""
    server = RedisProcess().start()
    port = server.port
    try:
        tiers = [
            RedisTier(
                BytearraySlotMemory(64 * 1024, 16),
                server.url,
                namespace="t",
                backoff_s=0.05,
                max_backoff_s=0.2,
                op_timeout_s=0.5,
                lookup="sync",
            )
            for _ in range(2)
        ]
        keys = fresh_keys(16)
        for t in tiers:
            fill(t.memory, keys, list(range(16)))  # type: ignore[arg-type]
        for _ in range(5):
            tiers[0].submit_put(keys, list(range(16)))
        time.sleep(0.01)
        server.kill()  # mid-pipeline: some puts land, some do not
        for t in tiers:
            results = wait(t, 15)
            assert all(r.kind is JobKind.PUT for r in results)
            assert t.contains(keys[:1]) in ([Presence.MISS], [Presence.HIT])
            t.submit_get(keys[:4], [0, 1, 2, 3])
            (down,) = wait(t, 15)
            assert down.ok == (False,) * 4
            assert set(down.reasons.values()) == {"unavailable"}
            assert not t.health().ok or t.stats()["connection_errors"] >= 1
        server = RedisProcess(port).start()  # same port, empty server
        time.sleep(0.25)  # past the back-off
        tiers[1].submit_put(keys[:8], list(range(8)))
        assert wait(tiers[1], 15)[0].all_ok
        tiers[0].memory.slot_view(15)[:] = b"\0" * tiers[0].memory.slot_bytes
        tiers[0].submit_get(keys[:8], [8, 9, 10, 11, 12, 13, 14, 15])
        (back,) = wait(tiers[0], 15)
        assert back.all_ok
        for i, key in enumerate(keys[:8]):
            assert bytes(tiers[0].memory.slot_view(8 + i)) == pattern(key, 64 * 1024)
        assert tiers[0].health().ok
        for t in tiers:
            t.close()
    finally:
        server.close()


def test_cluster_node_stopped_misses_its_keys_and_the_others_keep_working() -> None:
    cluster = RedisClusterProcesses().start()
    try:
        memory = BytearraySlotMemory(SLOT, 64)
        tier = RedisTier(memory, cluster.url, cluster=True, namespace="t", op_timeout_s=5.0)
        keys = fresh_keys(32)
        fill(memory, keys, list(range(32)))
        tier.submit_put(keys, list(range(32)))
        assert wait(tier)[0].all_ok
        stopped = cluster.nodes[1]
        on_stopped = {
            k for k in keys if tier._client.get_node_from_key(tier._name(k)).port == stopped.port
        }
        assert 0 < len(on_stopped) < len(keys)
        stopped.kill()
        tier.submit_get(keys, list(range(32, 64)))
        (result,) = wait(tier, 20)
        for i, key in enumerate(keys):
            assert result.ok[i] == (key not in on_stopped)
            if result.ok[i]:
                assert bytes(memory.slot_view(32 + i)) == pattern(key)
        assert set(result.reasons.values()) == {"unavailable"}
        assert tier.health().ok  # the tier is up; one node is backing off
        tier.close()
    finally:
        cluster.close()


def test_cluster_hash_tag_puts_a_namespace_in_one_slot(cluster_url: str) -> None:
    memory = BytearraySlotMemory(SLOT, 8)
    tier = RedisTier(memory, cluster_url, cluster=True, namespace="tagged", hash_tag="namespace")
    try:
        keys = fresh_keys(8)
        slots = {tier._client.keyslot(tier._name(k)) for k in keys}
        assert len(slots) == 1
        fill(memory, keys, list(range(8)))
        tier.submit_put(keys, list(range(8)))
        assert wait(tier)[0].all_ok
        assert {b.key for b in tier.scan()} >= set(keys)
    finally:
        tier.close()


def test_two_processes_share_one_server(standalone_url: str, tmp_path: Path) -> None:
    """Blocks stored by process A load byte-exact in process B (and B's misses are misses)."""
    keys = fresh_keys(12)
    writer = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_redis_tier import pattern
        from kvoffload.tiers import BytearraySlotMemory
        from kvoffload.tiers.redis import RedisTier
        keys = [bytes.fromhex(h) for h in sys.argv[1:]]
        m = BytearraySlotMemory({SLOT}, len(keys))
        t = RedisTier(m, {standalone_url!r}, namespace="shared", secret=b"fleet-secret-0123")
        for i, k in enumerate(keys):
            m.slot_view(i)[:] = pattern(k)
        t.submit_put(keys, list(range(len(keys))))
        assert t.drain(10)
        assert all(r.all_ok for r in t.poll())
        t.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run(
        [sys.executable, "-c", writer, *(k.hex() for k in keys[:8])],
        env=env,
        check=True,
        timeout=60,
    )
    memory = BytearraySlotMemory(SLOT, 12)
    reader = RedisTier(
        memory, standalone_url, namespace="shared", secret=b"fleet-secret-0123", lookup="sync"
    )
    try:
        assert reader.contains(keys) == [Presence.HIT] * 8 + [Presence.MISS] * 4
        reader.submit_get(keys, list(range(12)))
        (result,) = wait(reader)
        assert result.ok == (True,) * 8 + (False,) * 4
        for i, key in enumerate(keys[:8]):
            assert bytes(memory.slot_view(i)) == pattern(key)
    finally:
        reader.close()


def test_bad_arguments_are_clear_errors(standalone_url: str) -> None:
    memory = BytearraySlotMemory(SLOT, 2)
    with pytest.raises(ValueError, match="prefix"):
        RedisTier(memory, standalone_url, prefix="a:b")
    with pytest.raises(TypeError, match="workers"):
        RedisTier(memory, standalone_url, workers="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="secret"):
        RedisTier(memory, standalone_url, secret=b"short")
    with pytest.raises(ValueError, match="max_value_bytes"):
        RedisTier(memory, standalone_url, max_value_bytes=100)
    tier = RedisTier(memory, standalone_url)
    try:
        with pytest.raises(TypeError, match="sequences"):
            tier.submit_put(b"0123", [0])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="must pair up, got 2 and 1"):
            tier.submit_get([b"a", b"b"], [0])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="slot must be in"):  # checked at submit, as a get
            tier.submit_put([bytes(32)], [2])  # type: ignore[list-item]
    finally:
        tier.close()
    # the one closed-tier rule: nothing served, every job reported with "closed" verdicts
    key = bytes(32)
    assert tier.contains([key]) == [Presence.MISS]  # type: ignore[list-item]
    job = tier.submit_put([key], [0])  # type: ignore[list-item]
    assert tier.drain(0)
    (result,) = tier.poll()
    assert result.job_id == job and result.reasons == {0: "closed"} and not result.all_ok


def _make_tls_files(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (openssl CLI)."""
    files = {n: directory / n for n in ("ca.key", "ca.crt", "srv.key", "srv.csr", "srv.crt")}
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(files["ca.key"]),
        "-out",
        str(files["ca.crt"]),
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(files["srv.key"]),
        "-out",
        str(files["srv.csr"]),
    )
    run(
        "x509",
        "-req",
        "-in",
        str(files["srv.csr"]),
        "-CA",
        str(files["ca.crt"]),
        "-CAkey",
        str(files["ca.key"]),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        str(ext),
        "-out",
        str(files["srv.crt"]),
    )
    return files


def test_tls_with_a_ca_file(tmp_path: Path) -> None:
    import shutil as _shutil

    if _shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    files = _make_tls_files(tmp_path)
    server = RedisProcess(
        None,
        "--tls-cert-file",
        str(files["srv.crt"]),
        "--tls-key-file",
        str(files["srv.key"]),
        "--tls-ca-cert-file",
        str(files["ca.crt"]),
        "--tls-auth-clients",
        "no",
    )
    server.extra = (*server.extra, "--tls-port", str(server.port))
    tls_port = server.port
    server.port = 0  # plain TCP off: TLS only
    try:
        server.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--dir",
                str(server.dir),
                "--save",
                "",
                *server.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"rediss://127.0.0.1:{tls_port}/0"
        memory = BytearraySlotMemory(SLOT, 2)
        deadline = time.monotonic() + 10
        while True:
            try:
                tier = RedisTier(memory, url, namespace="tls", ssl_ca_certs=str(files["ca.crt"]))
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        (key,) = fresh_keys(1)
        fill(memory, [key], [0])
        tier.submit_put([key], [0])
        assert wait(tier)[0].all_ok
        tier.submit_get([key], [1])
        assert wait(tier)[0].all_ok
        assert bytes(memory.slot_view(1)) == pattern(key)
        tier.close()
        big = BytearraySlotMemory(512 * 1024, 4)  # records over many TLS records
        tier = RedisTier(big, url, namespace="tls", ssl_ca_certs=str(files["ca.crt"]))
        assert tier._direct is not None
        keys = fresh_keys(2)
        fill(big, keys, [0, 1])
        tier.submit_put(keys, [0, 1])
        assert wait(tier)[0].all_ok
        tier.submit_get(keys, [3, 2])
        assert wait(tier)[0].all_ok
        assert bytes(big.slot_view(3)) == pattern(keys[0], 512 * 1024)
        assert bytes(big.slot_view(2)) == pattern(keys[1], 512 * 1024)
        tier.close()
        with pytest.raises(ConnectionError):  # a server whose certificate we cannot verify
            RedisTier(memory, url, namespace="tls", ssl_ca_certs=str(files["srv.crt"]))
    finally:
        server.close()


@pytest.mark.parametrize("mode", ["standalone", "cluster"])
def test_the_tier_conformance_suite(mode: str, request: pytest.FixtureRequest) -> None:
    """The contract every tier keeps (the budget checks belong to the server's maxmemory)."""
    from kvoffload.testing.tiers import check_tier_conformance

    url = request.getfixturevalue(f"{mode}_url")
    made: list[RedisTier] = []

    def make(memory: BytearraySlotMemory, records: int) -> RedisTier:
        tier = RedisTier(
            memory,
            url,
            cluster=mode == "cluster",
            prefix=f"conf-{uuid.uuid4().hex[:12]}",
            namespace="conformance",
            lookup="sync",
        )
        made.append(tier)
        return tier

    try:
        check_tier_conformance(make, client_budget=False)
    finally:
        for tier in made:
            tier.close()
