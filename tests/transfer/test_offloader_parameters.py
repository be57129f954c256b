"""KVOffloader's budget and disk-tier parameters: sizes read one way, one-line errors that name
what the caller typed (issue 27 item 14), on real tensors and real directories."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from transfer_helpers import make_caches  # noqa: E402

from kvoffload.offloader import KVOffloader  # noqa: E402
from kvoffload.spec import OffloadingConfig  # noqa: E402
from kvoffload.tiers.config import parse_tier  # noqa: E402

TOKENS = 4  # tokens per device block in make_caches
PER_SLOT = 2 * 2 * TOKENS * 2 * 4 * 2  # layers * (K, V) * tokens * heads * head_size * fp16


def _caches() -> list[torch.Tensor]:
    return make_caches("kv_first", torch.float16, layers=2, blocks=8, seed=1)


def test_cpu_bytes_takes_a_size_as_capacity_bytes_does(tmp_path: Path) -> None:
    with KVOffloader(_caches(), cpu_bytes="64KiB") as off:
        assert off.spec.num_slots == (64 << 10) // PER_SLOT
    assert OffloadingConfig(cpu_bytes_to_use="1.5MiB").cpu_bytes_to_use == 3 << 19
    tier = parse_tier({"type": "disk", "path": str(tmp_path), "capacity_bytes": "1.5MiB"})
    assert tier.params["capacity_bytes"] == 3 << 19


@pytest.mark.parametrize(
    ("given", "error", "says"),
    [
        ("8 lots", ValueError, "cannot read '8 lots' as a size"),
        ([8], TypeError, "got list [8]"),
        (0, ValueError, "at least 1, got 0"),
    ],
)
def test_a_bad_cpu_bytes_names_cpu_bytes(given: object, error: type, says: str) -> None:
    with pytest.raises(error) as info:
        KVOffloader(_caches(), cpu_bytes=given)  # type: ignore[arg-type]
    text = str(info.value)
    assert text.startswith("cpu_bytes must be bytes: an int or a size like '8GiB'")
    assert says in text and "cpu_bytes_to_use" not in text


def test_more_cpu_bytes_than_the_machine_has_is_one_line_naming_cpu_bytes() -> None:
    from kvoffload.spec import host_memory_bytes

    memory = host_memory_bytes()
    assert memory is not None
    with pytest.raises(ValueError) as info:
        KVOffloader(_caches(), cpu_bytes=1 << 50)
    text = str(info.value)
    assert text.startswith(f"cpu_bytes asks for {1 << 50} bytes (1024.0 TiB) of host memory")
    assert f"more than this machine's {memory} bytes" in text and "\n" not in text
    assert "alloc" not in text  # not torch's allocator message


def test_a_disk_path_that_is_a_file_names_the_key(tmp_path: Path) -> None:
    afile = tmp_path / "kv"
    afile.write_text("not a directory")
    for path, what in ((afile, "which is a file"), (afile / "sub", "is under the file")):
        tiers = [{"type": "disk", "path": str(path), "capacity_bytes": "1MiB"}]
        with pytest.raises(ValueError) as info:
            KVOffloader(_caches(), cpu_bytes=4 * PER_SLOT, tiers=tiers)
        text = str(info.value)
        assert text.startswith("config 'tiers[0].path' must be a directory") and what in text
        assert str(path) in text


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs a /proc (Linux)")
def test_a_disk_path_that_cannot_be_created_names_the_key() -> None:
    tiers = [{"type": "disk", "path": "/proc/kv", "capacity_bytes": "1MiB"}]
    with pytest.raises(ValueError) as info:
        KVOffloader(_caches(), cpu_bytes=4 * PER_SLOT, tiers=tiers)
    assert str(info.value).startswith(
        "config 'tiers[0].path' must be a directory this process can create and write, got "
        "'/proc/kv': "
    )


def test_a_disk_capacity_past_the_free_space_warns_once_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    free = shutil.disk_usage(tmp_path).free
    tiers = [{"type": "disk", "path": str(tmp_path), "capacity_bytes": free * 4}]
    with caplog.at_level(logging.WARNING, logger="kvoffload.tiers.config"):
        KVOffloader(_caches(), cpu_bytes=4 * PER_SLOT, tiers=tiers).close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warnings = [w for w in warnings if "capacity_bytes" in w]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"config 'tiers[0].capacity_bytes' is {free * 4} bytes")
    assert f"free at {tmp_path}" in warnings[0]
    caplog.clear()
    tiers = [{"type": "disk", "path": str(tmp_path), "capacity_bytes": "1MiB"}]
    with caplog.at_level(logging.WARNING, logger="kvoffload.tiers.config"):
        KVOffloader(_caches(), cpu_bytes=4 * PER_SLOT, tiers=tiers).close()
    assert not [r for r in caplog.records if "capacity_bytes" in r.getMessage()]
