"""The README's Python example runs as written (and its commands are the ones CI runs)."""

from __future__ import annotations

import re
import sys
import types

import pytest

from conftest import REPO_ROOT
from kvoffload.policies import CachePolicyFactory


def _python_blocks() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_policy_example_runs() -> None:
    code = _python_blocks()[0]
    module = types.ModuleType("readme_example")
    sys.modules["readme_example"] = module
    try:
        with CachePolicyFactory.registry_snapshot():
            exec(compile(code, "README.md", "exec"), module.__dict__)
            policy = module.__dict__["policy"]
            assert type(policy).__name__ == "MRUCachePolicy"
            assert policy.cache_capacity == 1024
    finally:
        del sys.modules["readme_example"]


def test_readme_manager_example_runs() -> None:
    namespace: dict[str, object] = {}
    exec(compile(_python_blocks()[1], "README.md", "exec"), namespace)
    stats = namespace["manager"].get_stats()  # type: ignore[attr-defined]
    assert stats.stored_blocks == 8 and stats.stores_completed == 8


def test_readme_has_both_fresh_machine_commands() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    assert re.search(r"^pip install .*&& kvoffload simulate$", text, flags=re.M)
    assert re.search(r"^pip install .*&& python -m pytest", text, flags=re.M)


def _block_with(marker: str) -> str:
    blocks = [b for b in _python_blocks() if marker in b]
    assert len(blocks) == 1, f"expected one README python block with {marker!r}"
    return blocks[0]


def test_readme_tiers_and_data_plane_example_restarts_warm_on_a_cpu() -> None:
    """Blocks stored by one offloader come back from its disk into a new one, byte-checked."""
    pytest.importorskip("torch", reason="the data plane needs the [torch] extra")
    code = _block_with("KVOffloader")
    assert 'device="cpu"' in code  # runs on a laptop; no CUDA needed
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["hit"] == 8
    kv = namespace["kv"]
    assert all(t[:, 16:24].equal(t[:, 0:8]) for t in kv)  # type: ignore[attr-defined]
    stats = namespace["restarted"].manager.get_stats()  # type: ignore[attr-defined]
    assert stats.tiers["disk"]["hits"] == 8  # read from disk, not from the CPU tier


def test_readme_real_model_example_reuses_the_prefix() -> None:
    pytest.importorskip("transformers", minversion="5.25")
    namespace: dict[str, object] = {}
    exec(compile(_block_with("PrefixCache"), "README.md", "exec"), namespace)
    warm = namespace["warm"]
    assert (warm.hit_tokens, warm.computed_tokens) == (96, 8)  # type: ignore[attr-defined]


def test_readme_says_how_to_get_torch_cpu_and_the_trace() -> None:
    text = (REPO_ROOT / "README.md").read_text()
    assert "--index-url https://download.pytorch.org/whl/cpu" in text
    assert "KVOFFLOAD_TRACE" in text
