"""kvoffload's policies inside vLLM's own manager, and vLLM-API policies inside ours.

Needs vLLM (``tools/setup_vllm_env.sh`` builds an environment with it); skipped without.
The trace comparisons replay the shared synthetic trace with ``benchmarks/compare_vllm.py``'s
call sequence; ``-rP`` shows each policy's hit counts.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import sys
import textwrap
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from kvoffload.integrations import vllm as kv_vllm
except ImportError as exc:
    pytest.skip(f"vLLM is not importable here: {exc}", allow_module_level=True)

from vllm.config import KVTransferConfig
from vllm.v1.kv_offload.base import LookupResult as VllmLookupResult
from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
from vllm.v1.kv_offload.base import make_offload_key as vllm_make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmManager
from vllm.v1.kv_offload.cpu.policies.arc import ARCCachePolicy as VllmARC
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy as VllmCachePolicy
from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory as VllmFactory
from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy as VllmLRU
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from kvoffload import cli
from kvoffload.context import ReqContext
from kvoffload.integrations import vllm_api
from kvoffload.integrations.vllm_policy_adapter import VllmPolicyAdapter
from kvoffload.keys import OffloadKey
from kvoffload.manager import CPUOffloadingManager
from kvoffload.policies import (
    BUILTIN_POLICIES,
    BlockStatus,
    CachePolicy,
    Victims,
    create_cache_policy,
    get_cache_policy_cls,
)
from kvoffload.sim.capacity import parse_capacity
from kvoffload.sim.traces import load_trace
from kvoffload.testing import check_policy_conformance

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import compare_vllm  # noqa: E402 - a script directory, not a package
from conftest import require_shared_trace  # noqa: E402

MODULE = "kvoffload.integrations.vllm"
CAPACITY = "5%"
POLICY_NAMES = [name for name, *_ in BUILTIN_POLICIES]
CLASS_NAMES = {name: class_name for name, _module, class_name, _doc in BUILTIN_POLICIES}

#: Policies whose batch calls are not equivalent to the single calls vLLM's manager makes
#: (``kvoffload.policies.base`` requires them to be). For these, vLLM's manager is compared with
#: our manager driving the policy one call at a time (see ``SingleCalls``).
BATCH_DIFFERENCES = {
    "kvaware": "insert_many advances its clock once per batch where insert advances it per "
    "key, and touches_misses=False although touching absent keys advances its clock",
}


# ---------------------------------------------------------------- the trace replays
@pytest.fixture(scope="module")
def trace_keys() -> tuple[list[list[bytes]], int, int]:
    """Keys per request (vLLM's bytes equal ours, checked), capacity in blocks, block tokens."""
    trace = load_trace(require_shared_trace())
    ids = [r.block_ids for r in trace.requests]
    keys = compare_vllm.build_keys(compare_vllm.load_ours(), ids)
    vllm_lib, note = compare_vllm.load_vllm()
    assert vllm_lib is not None, note
    assert compare_vllm.build_keys(vllm_lib, ids) == keys
    capacity = parse_capacity(CAPACITY, trace.num_unique_blocks, trace.block_tokens).blocks
    return keys, capacity, trace.block_tokens


def vllm_library(module_path: str | None) -> compare_vllm.Library:
    lib, note = compare_vllm.load_vllm()
    assert lib is not None, note
    lib.manager_cls = functools.partial(VllmManager, cache_policy_module_path=module_path)
    return lib


def replay_hits(
    lib: compare_vllm.Library, policy: str, trace: tuple[list[list[bytes]], int, int]
) -> int:
    keys, capacity, block_tokens = trace
    contexts = compare_vllm.make_contexts(lib, keys, block_tokens, positions=True)
    hits, _ns = compare_vllm.replay(lib, policy, capacity, keys, contexts)
    return hits


class SingleCalls(CachePolicy):
    """Our policy driven as vLLM's manager drives it: one insert or release per call, and
    touches of keys that are not stored (``on_request_access`` reports them)."""

    def __init__(self, inner: CachePolicy) -> None:
        super().__init__(inner.cache_capacity)
        self.inner = inner

    def get(self, key: OffloadKey) -> BlockStatus | None:
        return self.inner.get(key)

    def insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None = None
    ) -> None:
        self.inner.insert(key, block, req_context)

    def remove(self, key: OffloadKey) -> None:
        self.inner.remove(key)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        self.inner.touch(keys, req_context)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        return self.inner.evict(n, protected)

    def clear(self) -> None:
        self.inner.clear()

    def mark_evictable(self, key: OffloadKey) -> None:
        self.inner.mark_evictable(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.inner.mark_non_evictable(key)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.inner.on_request_finished(req_context)


def single_call_library() -> compare_vllm.Library:
    lib = compare_vllm.load_ours()

    def manager(capacity: int, cache_policy: str) -> CPUOffloadingManager:
        policy = SingleCalls(create_cache_policy(cache_policy, capacity))
        return CPUOffloadingManager(capacity, cache_policy=policy)

    lib.manager_cls = manager
    return lib


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_vllm_manager_with_our_policy_hits_like_our_manager(
    name: str, trace_keys: tuple[list[list[bytes]], int, int]
) -> None:
    vllm_hits = replay_hits(vllm_library(MODULE), CLASS_NAMES[name], trace_keys)
    ours_hits = replay_hits(compare_vllm.load_ours(), name, trace_keys)
    if name in BATCH_DIFFERENCES:
        reference = replay_hits(single_call_library(), name, trace_keys)
        print(f"{name}: ours {ours_hits}, ours single calls {reference}, vLLM {vllm_hits}")
        assert vllm_hits == reference, BATCH_DIFFERENCES[name]
    else:
        print(f"{name}: ours {ours_hits}, vLLM manager with ours {vllm_hits}")
        assert vllm_hits == ours_hits


@pytest.mark.parametrize(("name", "vllm_cls"), [("lru", VllmLRU), ("arc", VllmARC)])
def test_our_manager_with_vllm_policy_hits_like_vllm_manager(
    name: str, vllm_cls: type, trace_keys: tuple[list[list[bytes]], int, int]
) -> None:
    target = f"{vllm_cls.__module__}:{vllm_cls.__name__}"
    ours_hits = replay_hits(compare_vllm.load_ours(), target, trace_keys)
    vllm_hits = replay_hits(vllm_library(None), name, trace_keys)
    print(f"vLLM {name}: our manager {ours_hits}, vLLM manager {vllm_hits}")
    assert ours_hits == vllm_hits


# ------------------------------------------------------------ loading by vLLM's factory
def test_every_builtin_loads_through_vllms_factory_by_class_name_and_alias() -> None:
    for name, _module, class_name, _doc in BUILTIN_POLICIES:
        for configured in (class_name, kv_vllm.ALIAS_PREFIX + class_name):
            cls = VllmFactory.get_cache_policy_cls(configured, MODULE)
            assert cls is kv_vllm.POLICY_CLASSES[name]
            assert issubclass(cls, VllmCachePolicy)
        manager = VllmManager(4, cache_policy=class_name, cache_policy_module_path=MODULE)
        policy = manager._policy
        assert type(policy.policy) is get_cache_policy_cls(name)
        assert policy.policy.cache_capacity == 4


def documented_kv_transfer_config() -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON of docs/vllm.md ("Use with vLLM")."""
    text = (REPO_ROOT / "docs" / "vllm.md").read_text()
    match = re.search(r"--kv-transfer-config '([^']+)'", text)
    assert match is not None, "docs/vllm.md has no --kv-transfer-config example"
    return json.loads(match.group(1))


def test_documented_config_makes_vllms_cpu_spec_build_our_policy() -> None:
    config = KVTransferConfig(**documented_kv_transfer_config())
    assert config.kv_connector == "OffloadingConnector"
    block_bytes = 4096
    offloading = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer0",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=False,
        extra_config=config.kv_connector_extra_config,
        engine_id="test",
        model=OffloadingModelConfig(name="test", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )
    manager = CPUOffloadingSpec(offloading).get_manager()
    extra = config.kv_connector_extra_config
    assert type(manager._policy) is getattr(kv_vllm, extra["eviction_policy"])
    assert manager._policy.policy.cache_capacity == extra["cpu_bytes_to_use"] // block_bytes


def test_registered_short_names_stay_vllms_own() -> None:
    """vLLM's factory checks its registry by the configured string before the module path."""
    assert VllmFactory.get_cache_policy_cls("lru", MODULE) is VllmLRU
    assert VllmFactory.get_cache_policy_cls("arc", MODULE) is VllmARC
    assert VllmFactory.get_cache_policy_cls("LRUCachePolicy", MODULE) is kv_vllm.LRUCachePolicy


def test_policy_with_parameters_is_a_class_vllm_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"tuned_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "from kvoffload.integrations.vllm import vllm_policy_class\n"
        f"TunedS3FIFO = vllm_policy_class('s3fifo', 'TunedS3FIFO', module={module!r}, "
        "small_size_ratio=0.25)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    manager = VllmManager(8, cache_policy="TunedS3FIFO", cache_policy_module_path=module)
    inner = manager._policy.policy
    assert type(inner) is get_cache_policy_cls("s3fifo")
    assert inner.small_size_ratio == 0.25
    with pytest.raises(ValueError, match="Bad cache_policy_params"):
        kv_vllm.vllm_policy_class("s3fifo", no_such_parameter=1)
    sys.modules.pop(module, None)


class Vllm032ShapedPolicy:
    """vLLM 0.31/0.32's CachePolicy shape: no on_request_access, insert without a context."""

    def insert(self, key: bytes, chunk: object) -> None: ...

    def on_store_miss(self, keys: object, req_context: object) -> None: ...

    def on_request_finished(
        self, key_groups: object, insertion_only_keys: object, reused_keys: object, ctx: object
    ) -> None: ...


def test_older_vllm_policy_api_is_rejected_and_untested_releases_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(
        ImportError,
        match=r"vLLM 0\.32\.0 is not supported.*CachePolicy\.on_request_access, "
        r"CachePolicy\.insert\(key, chunk, req_context\).*pip install 'vllm>=0\.33,<0\.34'",
    ):
        vllm_api.check_supported(Vllm032ShapedPolicy, "0.32.0")
    with caplog.at_level(logging.WARNING, logger=vllm_api.__name__):
        vllm_api.check_supported(VllmCachePolicy, vllm_api.TESTED_VLLM_VERSIONS[0])
        assert caplog.text == ""
        vllm_api.check_supported(VllmCachePolicy, "0.34.0")
    assert "vLLM 0.34.0 is installed" in caplog.text


# ------------------------------------------------------ forward adapter semantics
def vkey(i: int) -> bytes:
    return vllm_make_offload_key(i.to_bytes(8, "big"), 0)


def store(manager: VllmManager, ctx: VllmReqContext, keys: list[bytes]) -> list[bytes]:
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    return list(out.evicted_keys)


def test_completed_request_releases_tail_first_so_its_head_outlives_its_tail() -> None:
    manager = VllmManager(3, cache_policy="LRUCachePolicy", cache_policy_module_path=MODULE)
    a, b, c, d = (vkey(i) for i in range(4))
    store(manager, VllmReqContext(req_id="1"), [a, b, c])
    assert store(manager, VllmReqContext(req_id="2"), [d]) == [c]
    assert manager.lookup(a, VllmReqContext(req_id="3")) is VllmLookupResult.HIT


def test_status_objects_are_vllms_and_pins_are_seen_by_our_policy() -> None:
    manager = VllmManager(2, cache_policy="FIFOCachePolicy", cache_policy_module_path=MODULE)
    a, b, c = vkey(1), vkey(2), vkey(3)
    store(manager, VllmReqContext(req_id="1"), [a, b])
    status = manager._policy.policy.get(a)
    assert type(status).__name__ == "ChunkStatus" and status.ref_cnt == 0
    ctx = VllmReqContext(req_id="2")
    manager.on_new_request(ctx)
    manager.prepare_load([a], ctx)  # pins a: FIFO's oldest block must be skipped
    assert status.ref_cnt == 1
    out = manager.prepare_store([c], ctx)
    assert out is not None and out.evicted_keys == [b]
    manager.complete_load([a], ctx)
    assert status.ref_cnt == 0


def test_request_context_is_translated_with_positions_and_hints(
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = kv_vllm.RetentionCachePolicy(cache_capacity=4)
    hints = {"session_id": "s1", "priority": 80, "priority_duration_s": 2.5, "bogus": 1}
    ctx = VllmReqContext(req_id="r", kv_transfer_params={"kvoffload": hints})
    ctx.set_offload_key_position(vkey(1), 16)
    with caplog.at_level(logging.WARNING, logger=MODULE):
        ours = policy._context(ctx, [vkey(1), vkey(2)])
    assert (ours.req_id, ours.session_id, ours.priority, ours.priority_duration_s) == (
        "r",
        "s1",
        80,
        2.5,
    )
    assert ours.get_offload_key_position(vkey(1)) == 16
    assert ours.get_offload_key_position(vkey(2)) is None
    assert "'bogus'" in caplog.text
    assert policy._context(ctx, []) is ours  # one per request and policy instance
    other = kv_vllm.RetentionCachePolicy(cache_capacity=4)
    assert other._context(ctx, []) is not ours
    bad = VllmReqContext(req_id="x", kv_transfer_params={"kvoffload": {"priority": "high"}})
    assert policy._context(bad, []).priority is None


# ------------------------------------------------------------ the reverse adapter
TINY_POLICY = '''
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy


class TinyFIFO(CachePolicy):
    """A FIFO written against vLLM's CachePolicy API; logs its hook calls."""

    log = []

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.chunks = {}

    def get(self, key):
        return self.chunks.get(key)

    def insert(self, key, chunk, req_context):
        self.log.append(("insert", key, chunk.ref_cnt))
        self.chunks[key] = chunk

    def remove(self, key):
        self.chunks.pop(key, None)

    def touch(self, keys, req_context):
        self.log.append(("touch", tuple(keys)))

    def on_store_miss(self, keys, req_context):
        self.log.append(("on_store_miss", tuple(keys)))

    def on_request_access(self, keys, req_context):
        self.log.append(("on_request_access", tuple(keys)))

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys, req_context):
        self.log.append(
            ("on_request_finished", key_groups, frozenset(insertion_only_keys),
             frozenset(reused_keys), req_context.req_id)
        )

    def evict(self, n, protected):
        chosen = [k for k, c in self.chunks.items() if c.ref_cnt == 0 and k not in protected][:n]
        if len(chosen) < n:
            return None
        self.log.append(("evict", tuple(chosen)))
        return [(k, self.chunks.pop(k)) for k in chosen]

    def clear(self):
        self.chunks.clear()

    def mark_evictable(self, key):
        self.log.append(("mark_evictable", key))

    def mark_non_evictable(self, key):
        self.log.append(("mark_non_evictable", key))
'''


@pytest.fixture()
def tiny_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    name = f"tiny_vllm_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TINY_POLICY))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    yield module
    sys.modules.pop(name, None)


def test_our_factory_wraps_a_vllm_policy_class(tiny_module: Any) -> None:
    cls = get_cache_policy_cls(f"{tiny_module.__name__}:TinyFIFO")
    assert issubclass(cls, VllmPolicyAdapter) and issubclass(cls, CachePolicy)
    assert cls.vllm_policy_cls is tiny_module.TinyFIFO
    assert get_cache_policy_cls("TinyFIFO", tiny_module.__name__) is cls
    assert cls.__doc__.startswith("A FIFO written against vLLM's CachePolicy API")


def drive(manager: Any, make_ctx: Any, hit: Any) -> None:
    """Three requests through either manager: store, reuse a prefix with eviction, reuse."""
    a, b, c, d, e = (vkey(i) for i in range(5))
    for rid, keys in (("r1", [a, b, c]), ("r2", [a, b, d, e]), ("r3", [a, b, d])):
        ctx = make_ctx(req_id=rid)
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * 16)
        manager.on_new_request(ctx)
        n = 0
        while n < len(keys) and manager.lookup(keys[n], ctx) is hit:
            n += 1
        if n:
            manager.prepare_load(keys[:n], ctx)
        if n < len(keys):
            out = manager.prepare_store(keys[n:], ctx)
            assert out is not None
            manager.complete_store(out.keys_to_store, ctx)
        if n:
            manager.complete_load(keys[:n], ctx)
        manager.on_request_finished(ctx)


def test_reverse_adapter_makes_the_calls_vllms_manager_makes(tiny_module: Any) -> None:
    log = tiny_module.TinyFIFO.log
    vllm_manager = VllmManager(
        4, cache_policy="TinyFIFO", cache_policy_module_path=tiny_module.__name__
    )
    drive(vllm_manager, VllmReqContext, VllmLookupResult.HIT)
    vllm_log = list(log)
    log.clear()
    ours = CPUOffloadingManager(4, cache_policy=f"{tiny_module.__name__}:TinyFIFO")
    drive(ours, ReqContext, compare_vllm.load_ours().hit)
    our_log = list(log)

    def without_pins(calls: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        # Our manager pins a load's keys after reporting the access, vLLM's before it.
        return [call for call in calls if call[0] != "mark_non_evictable"]

    assert without_pins(our_log) == without_pins(vllm_log)
    assert sorted(c for c in our_log if c[0] == "mark_non_evictable") == sorted(
        c for c in vllm_log if c[0] == "mark_non_evictable"
    )
    finished = [call for call in our_log if call[0] == "on_request_finished"]
    a, b, _c, d, e = (vkey(i) for i in range(5))
    assert finished[1] == ("on_request_finished", ((a, b, d, e),), {d, e}, {a, b}, "r2")
    assert ("evict", (vkey(2),)) in our_log  # the 4-slot FIFO drops r1's tail for r2's


def test_simulate_runs_a_vllm_policy_like_the_same_builtin(
    tiny_module: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    def simulate(policy: str) -> dict[str, Any]:
        argv = ["simulate", "--requests", "300", "--workers", "1", "--capacity", "3%"]
        assert cli.main([*argv, "--policy", policy, "--format", "json"]) == 0
        (result,) = json.loads(capsys.readouterr().out)["results"]
        return dict(result)

    theirs = simulate(f"{tiny_module.__name__}:TinyFIFO")
    ours = simulate("fifo")
    assert theirs["evictions"] > 0 and theirs["block_hits"] > 0
    for field in ("block_hits", "prefix_hit_ratio", "token_hit_ratio", "evictions"):
        assert theirs[field] == ours[field], field


@pytest.mark.parametrize("vllm_cls", [VllmLRU, VllmARC])
def test_vllms_own_policies_pass_our_conformance_suite(vllm_cls: type) -> None:
    adapted = get_cache_policy_cls(f"{vllm_cls.__module__}:{vllm_cls.__name__}")
    check_policy_conformance(adapted, seeds=(0, 1))
