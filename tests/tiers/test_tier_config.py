"""``tiers: [...]`` in the offloading config: checked against each tier, built by the spec."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.layout import KVCacheLayout, KVTensorLayout
from kvoffload.spec import OffloadingConfig, OffloadingSpecFactory
from kvoffload.tiers.config import parse_bytes, parse_tiers
from kvoffload.tiers.disk.tier import DiskTier
from kvoffload.tiers.manager import TieringManager, WritePolicy
from kvoffload.tiers.memory import MemoryTier


def _config(**extra: object) -> OffloadingConfig:
    return OffloadingConfig.from_extra_config({"cpu_bytes_to_use": 1 << 20, **extra})


def test_a_disk_tier_entry_is_checked_into_constructor_and_manager_keys(tmp_path: Path) -> None:
    cfg = _config(
        tiers=[
            {
                "type": "disk",
                "path": str(tmp_path),
                "capacity_bytes": "2GiB",
                "policy": "arc",
                "durability": "fsync",
                "write_policy": "write_back",
                "max_inflight_bytes": "64MiB",
                "fill": True,
            }
        ]
    )
    (tier,) = cfg.tiers
    assert tier.cls is DiskTier
    assert tier.params == {
        "path": str(tmp_path),
        "capacity_bytes": 2 << 30,
        "policy": "arc",
        "durability": "fsync",
    }
    assert tier.manager["write_policy"] == "write_back"
    assert tier.manager["max_inflight_bytes"] == 64 << 20
    assert tier.manager["fill"] is True


def test_vllm_secondary_tiers_fs_shape_is_our_disk_tier(tmp_path: Path) -> None:
    cfg = OffloadingConfig.from_extra_config(
        {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 1 << 20,
            "secondary_tiers": [
                {"type": "fs", "root_dir": str(tmp_path), "n_read_threads": 8, "n_write_threads": 2}
            ],
        }
    )
    (tier,) = cfg.tiers
    assert tier.cls is DiskTier and tier.type == "disk"
    assert tier.params == {"path": str(tmp_path), "io_threads": 8}
    with pytest.raises(ValueError, match="either 'tiers' or 'secondary_tiers'"):
        _config(tiers=[], secondary_tiers=[])


@pytest.mark.parametrize(
    ("entry", "error", "match"),
    [
        ({"type": "disk", "pth": "/x", "capacity_bytes": 1}, ValueError, "Did you mean 'path'"),
        ({"type": "dsk", "path": "/x"}, ValueError, "Did you mean 'disk'"),
        ({"path": "/x"}, ValueError, r"tiers\[0\]' needs a 'type'"),
        ({"type": "cpu"}, ValueError, "CPU tier is always first"),
        ({"type": "disk", "path": "/x", "capacity_bytes": "2 lots"}, ValueError, "cannot read"),
        ({"type": "disk", "path": "/x", "capacity_bytes": [1]}, TypeError, "capacity_bytes"),
        ({"type": "disk", "path": "/x", "durability": 3}, TypeError, r"tiers\[0\]\.durability"),
        ({"type": "disk", "path": "/x", "io_threads": "4"}, TypeError, "io_threads"),
        ({"type": "disk", "path": "/x", "write_policy": "later"}, ValueError, "write_through"),
        ({"type": "disk", "path": "/x", "fill": "yes"}, TypeError, "fill"),
        ({"type": "disk", "path": "/x", "lookup_retries": -1}, ValueError, "lookup_retries"),
        ({"type": "disk", "path": "/x", "backpressure": {}}, ValueError, "max_inflight_bytes"),
        ({"type": "disk"}, ValueError, "needs 'path'"),
        ({"type": "redis", "capacity_bytes": 5}, ValueError, "unknown key 'tiers.0.|maxmemory|"),
        ("memory", ValueError, r"tiers\[0\]' \(memory\) needs 'capacity_bytes'"),
        ({"type": "memory", "capacity_bytes": "64KiB"}, None, ""),
        (7, TypeError, r"tiers\[0\]' must be a mapping"),
        ({"type": "no.such.module:Tier"}, ImportError, r"tiers\[0\]\.type"),
        ({"type": "kvoffload.keys:OffloadKey"}, TypeError, r"tiers\[0\]\.type"),
    ],
)
def test_wrong_entries_name_the_key(entry: object, error: type | None, match: str) -> None:
    if error is None:
        assert parse_tiers([entry])[0].cls is MemoryTier
        return
    if entry == {"type": "redis", "capacity_bytes": 5}:
        pytest.importorskip("redis")
        match = r"unknown key 'tiers\[0\]\.capacity_bytes' for tier 'redis'"
    with pytest.raises(error, match=match):
        _config(tiers=[entry])


def test_tiers_must_be_a_list_and_need_one_worker() -> None:
    with pytest.raises(TypeError, match="'tiers' must be a list"):
        _config(tiers={"type": "memory"})
    with pytest.raises(ValueError, match="world_size 1"):
        _config(tiers=[{"type": "memory", "capacity_bytes": 4096}], world_size=2)
    assert _config().tiers == ()


def test_parse_bytes() -> None:
    assert parse_bytes("x", "2GiB") == 2 << 30
    assert parse_bytes("x", "1.5 MB") == 1_500_000
    assert parse_bytes("x", 4096) == 4096
    assert parse_bytes("x", "4096") == 4096
    with pytest.raises(ValueError, match="'x'"):
        parse_bytes("x", "2 GiBs")
    with pytest.raises(TypeError, match="'x'"):
        parse_bytes("x", True)


def _layout(dtype: str = "float16") -> KVCacheLayout:
    return KVCacheLayout([KVTensorLayout("l0", "kv_first", (2, 8, 16, 2, 8), dtype)])


def test_the_spec_builds_a_tiering_manager_over_the_workers_host_buffer(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cfg = _config(
        tiers=[
            {"type": "disk", "path": str(tmp_path), "capacity_bytes": "1MiB"},
            {"type": "memory", "capacity_bytes": 1 << 16, "write_policy": "none"},
        ]
    )
    spec = OffloadingSpecFactory.create_spec(cfg, _layout())
    manager = spec.get_manager()
    assert isinstance(manager, TieringManager)
    disk, memory = manager.tiers
    assert isinstance(disk, DiskTier) and isinstance(memory, MemoryTier)
    host = spec.host_buffer()  # type: ignore[attr-defined]
    assert manager.memory is host and disk.memory is host
    assert manager.get_stats().tiers["memory"]["write_policy"] == WritePolicy.NONE.value
    manager.shutdown()


def test_tier_namespaces_follow_the_layout(tmp_path: Path) -> None:
    """Two engines with other dtypes never read each other's records; the same layout does."""
    cfg = _config(tiers=[{"type": "disk", "path": str(tmp_path), "capacity_bytes": "1MiB"}])
    spec = OffloadingSpecFactory.create_spec
    ns16 = spec(cfg, _layout("float16")).tier_namespace  # type: ignore[attr-defined]
    ns_b16 = spec(cfg, _layout("bfloat16")).tier_namespace  # type: ignore[attr-defined]
    assert ns16 != ns_b16
    bigger = KVCacheLayout([KVTensorLayout("l0", "kv_first", (2, 99, 16, 2, 8), "float16")])
    assert spec(cfg, bigger).tier_namespace == ns16  # type: ignore[attr-defined]
    (tier,) = cfg.tiers
    mixed = spec(cfg, _layout())._tier_params(tier)  # type: ignore[attr-defined]
    assert mixed.params["namespace"] == ns16
    named = parse_tiers([{**tier.params, "type": "disk", "namespace": "qwen3-8b"}])[0]
    assert spec(cfg, _layout())._tier_params(named).params["namespace"] not in (  # type: ignore[attr-defined]
        ns16,
        b"qwen3-8b",
    )
