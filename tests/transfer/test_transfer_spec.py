"""OffloadingConfig validation, OffloadingSpec building, and the spec registry's rules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvoffload.layout import KVCacheLayout, KVTensorLayout
from kvoffload.manager import CPUOffloadingManager
from kvoffload.spec import (
    CPUOffloadingSpec,
    OffloadingConfig,
    OffloadingSpec,
    OffloadingSpecFactory,
)

LAYOUT = KVCacheLayout(
    [KVTensorLayout(f"layer.{i}", "kv_first", (2, 64, 16, 2, 8), "float16") for i in range(3)]
)
SLOT_BYTES = 3 * 2 * 16 * 2 * 8 * 2  # one device block per chunk


@pytest.fixture(autouse=True)
def _restore_registry():  # type: ignore[no-untyped-def]
    with OffloadingSpecFactory.registry_snapshot():
        yield


def test_vllm_style_extra_config_is_accepted() -> None:
    cfg = OffloadingConfig.from_extra_config(
        {
            "cpu_bytes_to_use": 4.5 * 2**30,  # vLLM computes GiB * 2**30 as a float
            "block_size": 32,
            "eviction_policy": "arc",
            "store_threshold": 2,
            "max_tracker_size": 100,
            "spec_name": "CPUOffloadingSpec",
        }
    )
    assert cfg.cpu_bytes_to_use == int(4.5 * 2**30) and isinstance(cfg.cpu_bytes_to_use, int)
    assert (cfg.block_size, cfg.eviction_policy, cfg.store_threshold) == (32, "arc", 2)


def test_unknown_key_gets_a_did_you_mean() -> None:
    with pytest.raises(ValueError, match=r"unknown config key 'evicton_policy'.*'eviction_policy'"):
        OffloadingConfig.from_extra_config({"cpu_bytes_to_use": 1 << 20, "evicton_policy": "lru"})
    with pytest.raises(ValueError, match="Accepted keys: cpu_bytes_to_use"):
        OffloadingConfig.from_extra_config({"cpu_bytes_to_use": 1 << 20, "zzz": 1})


def test_replaced_vllm_keys_say_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"num_cpu_blocks.*cpu_bytes_to_use"):
        OffloadingConfig.from_extra_config({"num_cpu_blocks": 100})
    with pytest.raises(ValueError, match="eviction_policy"):
        OffloadingConfig.from_extra_config({"cpu_bytes_to_use": 1, "cache_policy": "lru"})


@pytest.mark.parametrize(
    ("extra", "error", "message"),
    [
        ({}, ValueError, "'cpu_bytes_to_use' is required"),
        ({"cpu_bytes_to_use": 0}, ValueError, "cpu_bytes_to_use must be bytes: .*, got 0"),
        ({"cpu_bytes_to_use": "1G"}, ValueError, "cpu_bytes_to_use must be bytes: .* read '1G'"),
        ({"cpu_bytes_to_use": [1]}, TypeError, r"cpu_bytes_to_use must be bytes: .*, got list"),
        ({"cpu_bytes_to_use": 1, "block_size": 16, "blocks_per_chunk": 1}, ValueError, "only one"),
        (
            {"cpu_bytes_to_use": 1, "blocks_per_chunk": 0},
            ValueError,
            "blocks_per_chunk must be an int >= 1",
        ),
        ({"cpu_bytes_to_use": 1, "store_threshold": -1}, ValueError, "store_threshold"),
        (
            {"cpu_bytes_to_use": 1, "enable_kv_cache_events": 1},
            TypeError,
            "enable_kv_cache_events must be True or False",
        ),
        ({"cpu_bytes_to_use": 1, "eviction_policy": ""}, ValueError, "eviction_policy"),
        ({"cpu_bytes_to_use": 1, "eviction_policy": 3}, TypeError, "eviction_policy"),
        ({"cpu_bytes_to_use": 1, "cache_policy_params": [1]}, TypeError, "cache_policy_params"),
        ({"cpu_bytes_to_use": 1, "world_size": True}, TypeError, "world_size"),
    ],
)
def test_bad_values_name_the_key(extra: dict, error: type, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(error, match=message):
        OffloadingConfig.from_extra_config(extra)


def test_slots_come_from_the_byte_budget_and_world_size() -> None:
    spec = CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=10 * SLOT_BYTES + 5), LAYOUT)
    assert spec.num_slots == 10 and spec.host_bytes == 10 * SLOT_BYTES
    manager = spec.get_manager()
    assert isinstance(manager, CPUOffloadingManager) and manager.num_blocks == 10
    assert spec.get_manager() is manager
    shared = CPUOffloadingSpec(
        OffloadingConfig(cpu_bytes_to_use=10 * SLOT_BYTES, world_size=2), LAYOUT
    )
    assert shared.num_slots == 5  # the budget is for all workers together
    with pytest.raises(ValueError, match="cpu_bytes_to_use' is too small"):
        CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=SLOT_BYTES - 1), LAYOUT)


def test_chunk_size_from_tokens_or_blocks() -> None:
    by_tokens = CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=1 << 20, block_size=64), LAYOUT)
    assert by_tokens.blocks_per_chunk == 4 and by_tokens.tokens_per_chunk() == 64
    assert by_tokens.slot_layout.slot_bytes == 4 * SLOT_BYTES
    by_blocks = CPUOffloadingSpec(
        OffloadingConfig(cpu_bytes_to_use=1 << 20, blocks_per_chunk=2), LAYOUT
    )
    assert by_blocks.blocks_per_chunk == 2
    with pytest.raises(ValueError, match="multiple of the device block size"):
        CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=1 << 20, block_size=24), LAYOUT)


def test_manager_gets_the_policy_and_admission_settings() -> None:
    spec = CPUOffloadingSpec(
        OffloadingConfig(cpu_bytes_to_use=1 << 20, eviction_policy="arc", store_threshold=2),
        LAYOUT,
    )
    manager = spec.get_manager()
    assert type(manager.policy).__name__ == "ARCCachePolicy"
    with pytest.raises(ValueError, match="Unknown cache policy"):
        CPUOffloadingSpec(
            OffloadingConfig(cpu_bytes_to_use=1 << 20, eviction_policy="nope"), LAYOUT
        ).get_manager()


def test_factory_resolves_the_builtin_by_default() -> None:
    assert OffloadingSpecFactory.get_spec_cls() is CPUOffloadingSpec
    spec = OffloadingSpecFactory.create_spec(OffloadingConfig(cpu_bytes_to_use=1 << 20), LAYOUT)
    assert isinstance(spec, CPUOffloadingSpec)


def test_duplicate_registration_is_an_error() -> None:
    with pytest.raises(ValueError, match="'CPUOffloadingSpec' is already registered"):
        OffloadingSpecFactory.register_spec(
            "CPUOffloadingSpec", "kvoffload.spec", "CPUOffloadingSpec"
        )


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match=r"Unknown offloading spec: 'Nope'.*CPUOffloadingSpec.*spec_module_path"
    ):
        OffloadingSpecFactory.get_spec_cls("Nope")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_spec_plugin.py").write_text(
        textwrap.dedent(
            """
            from kvoffload.spec import CPUOffloadingSpec

            class TinySpec(CPUOffloadingSpec):
                '''A CPU spec that always keeps 3 slots.'''
                def __init__(self, config, layout):
                    super().__init__(config, layout)
                    self.num_slots = 3

            class NotASpec:
                pass

            NOT_A_CLASS = 5
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_spec_plugin"


def test_out_of_tree_spec_by_module_path_and_by_module_colon_class(plugin: str) -> None:
    cfg = OffloadingConfig(cpu_bytes_to_use=1 << 20, spec_name="TinySpec", spec_module_path=plugin)
    spec = OffloadingSpecFactory.create_spec(cfg, LAYOUT)
    assert type(spec).__name__ == "TinySpec" and spec.get_manager().num_blocks == 3
    assert OffloadingSpecFactory.get_spec_cls(f"{plugin}:TinySpec") is type(spec)


def test_registered_out_of_tree_spec_loads_lazily(plugin: str) -> None:
    OffloadingSpecFactory.register_spec("tiny", plugin, "TinySpec")
    assert "tiny" in OffloadingSpecFactory.registered_names()
    assert OffloadingSpecFactory.get_spec_cls("tiny").__name__ == "TinySpec"
    OffloadingSpecFactory.unregister_spec("tiny")
    with pytest.raises(ValueError, match="not registered"):
        OffloadingSpecFactory.unregister_spec("tiny")


def test_non_subclass_and_missing_class_and_module(plugin: str) -> None:
    with pytest.raises(
        TypeError, match=r"NotASpec.*not a subclass of kvoffload.spec.OffloadingSpec"
    ):
        OffloadingSpecFactory.get_spec_cls("NotASpec", plugin)
    with pytest.raises(TypeError, match="int instance"):
        OffloadingSpecFactory.get_spec_cls(f"{plugin}:NOT_A_CLASS")
    with pytest.raises(ImportError, match=r"has no class 'Missing'.*TinySpec"):
        OffloadingSpecFactory.get_spec_cls("Missing", plugin)
    with pytest.raises(ImportError, match="importing module 'no_such_module_xyz' failed"):
        OffloadingSpecFactory.get_spec_cls("X", "no_such_module_xyz")
    with pytest.raises(ValueError, match="a part is empty"):
        OffloadingSpecFactory.get_spec_cls(":X")


def test_spec_arguments_are_type_checked() -> None:
    with pytest.raises(TypeError, match="OffloadingConfig"):
        CPUOffloadingSpec({"cpu_bytes_to_use": 1}, LAYOUT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="KVCacheLayout"):
        CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=1 << 20), [])  # type: ignore[arg-type]
    assert issubclass(CPUOffloadingSpec, OffloadingSpec)


def test_scheduler_side_imports_need_no_torch() -> None:
    code = (
        "import sys, kvoffload, kvoffload.spec, kvoffload.transfer, kvoffload.layout\n"
        "from kvoffload.spec import CPUOffloadingSpec, OffloadingConfig\n"
        "from kvoffload.transfer import KVCacheLayout, KVTensorLayout\n"
        "layout = KVCacheLayout([KVTensorLayout('a', 'mla', (8, 16, 4), 'float16')])\n"
        "CPUOffloadingSpec(OffloadingConfig(cpu_bytes_to_use=1 << 20), layout).get_manager()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
