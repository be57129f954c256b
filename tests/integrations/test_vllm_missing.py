"""Without vLLM: the integration fails on import with a message saying what to install."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

from kvoffload.policies import get_cache_policy_cls

if importlib.util.find_spec("vllm") is not None:
    pytest.skip(
        "vLLM is installed here: tests/integrations/test_vllm.py runs instead",
        allow_module_level=True,
    )


@pytest.mark.parametrize(
    "module", ["kvoffload.integrations.vllm", "kvoffload.integrations.vllm_policy_adapter"]
)
def test_importing_an_adapter_says_to_install_vllm(module: str) -> None:
    sys.modules.pop(module, None)
    with pytest.raises(ImportError, match=r"Install vLLM: pip install 'vllm>=0\.33,<0\.35'"):
        importlib.import_module(module)


def test_a_vllm_api_policy_needs_vllm_to_run_in_our_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"fake_vllm_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            class CachePolicy:
                pass
            CachePolicy.__module__ = "vllm.v1.kv_offload.cpu.policies.base"

            class MyVLLMPolicy(CachePolicy):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="Install vLLM"):
        get_cache_policy_cls(f"{name}:MyVLLMPolicy")
    sys.modules.pop(name, None)
