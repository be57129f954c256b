from __future__ import annotations

import logging
import sys
import textwrap
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from kvoffload.policies import (
    BUILTIN_POLICIES,
    CachePolicy,
    CachePolicyFactory,
    create_cache_policy,
)
from kvoffload.policies import factory as factory_module
from kvoffload.policies.lru import LRUCachePolicy

POLICY_SOURCE = '''
from kvoffload.policies.lru import LRUCachePolicy

class MyPolicy(LRUCachePolicy):
    """My out-of-tree policy."""

class NotAPolicy:
    pass
'''


@pytest.fixture(autouse=True)
def isolated_registry() -> Iterator[None]:
    with CachePolicyFactory.registry_snapshot():
        yield


@pytest.fixture()
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"oot_policy_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(POLICY_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_builtins_resolve_by_short_and_vllm_class_names() -> None:
    assert CachePolicyFactory.get_cache_policy_cls("lru") is LRUCachePolicy
    assert CachePolicyFactory.get_cache_policy_cls("LRUCachePolicy") is LRUCachePolicy
    arc = CachePolicyFactory.get_cache_policy_cls("ARCCachePolicy")
    assert arc is CachePolicyFactory.get_cache_policy_cls("arc")


def test_every_builtin_loads_and_its_description_is_its_docstring() -> None:
    for name, _module, class_name, description in BUILTIN_POLICIES:
        cls = CachePolicyFactory.get_cache_policy_cls(name)
        assert issubclass(cls, CachePolicy)
        assert cls.__name__ == class_name
        assert cls.__doc__ is not None
        assert cls.__doc__.strip().splitlines()[0] == description


def test_only_classes_of_vllms_policy_api_go_to_the_vllm_adapter() -> None:
    from kvoffload.integrations.policy_adapters import (
        adapt_vllm_policy_class,
        is_vllm_policy_class,
    )

    fake_vllm_base = type("CachePolicy", (), {"__module__": "vllm.v1.kv_offload.cpu.policies.base"})
    user_policy = type("MyVLLMPolicy", (fake_vllm_base,), {"__module__": "my_policies"})
    assert is_vllm_policy_class(user_policy)
    assert not is_vllm_policy_class(LRUCachePolicy)
    assert not is_vllm_policy_class(type("NotAPolicy", (), {}))
    assert not is_vllm_policy_class(user_policy())  # an instance
    assert adapt_vllm_policy_class(type("NotAPolicy", (), {})) is None


def test_foreign_policy_classes_go_through_advertised_adapters(
    policy_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[type] = []

    def adapter(cls: type) -> type[CachePolicy] | None:
        calls.append(cls)
        return LRUCachePolicy if cls.__name__ == "NotAPolicy" else None

    ep = metadata.EntryPoint(name="x", value="m:f", group="kvoffload.policy_adapters")
    object.__setattr__(ep, "load", lambda: adapter)  # EntryPoint is immutable; tests only
    real = metadata.entry_points

    def entry_points(**kwargs: str) -> object:
        if kwargs.get("group") == "kvoffload.policy_adapters":
            return [ep]
        return real(**kwargs)

    monkeypatch.setattr(factory_module.metadata, "entry_points", entry_points)
    assert CachePolicyFactory.get_cache_policy_cls("NotAPolicy", policy_module) is LRUCachePolicy
    assert [c.__name__ for c in calls] == ["NotAPolicy"]


def test_kvoffloads_own_vllm_adapter_is_advertised() -> None:
    names = {ep.value for ep in metadata.entry_points(group="kvoffload.policy_adapters")}
    assert "kvoffload.integrations.policy_adapters:adapt_vllm_policy_class" in names


def test_registration_is_lazy(monkeypatch: pytest.MonkeyPatch) -> None:
    CachePolicyFactory.register_cache_policy("lazy", "module_that_does_not_exist_xyz", "Cls")
    assert "module_that_does_not_exist_xyz" not in sys.modules
    with pytest.raises(ImportError, match=r"'lazy'.*module_that_does_not_exist_xyz"):
        CachePolicyFactory.get_cache_policy_cls("lazy")


def test_importing_policies_imports_no_policy_module() -> None:
    import subprocess

    code = (
        "import sys, kvoffload.policies;"
        "print(any(m in sys.modules for m in ('kvoffload.policies.lru','kvoffload.policies.arc')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_duplicate_name_is_rejected_with_the_seed_message() -> None:
    with pytest.raises(ValueError) as info:
        CachePolicyFactory.register_cache_policy("lru", "x", "Y")
    assert str(info.value) == "Cache policy 'lru' is already registered."


def test_unknown_name_lists_registered_names_and_says_what_to_set() -> None:
    with pytest.raises(
        ValueError, match=r"Unknown cache policy: 'nope'.*'lru'.*cache_policy_module_path"
    ):
        CachePolicyFactory.get_cache_policy_cls("nope")


def test_registered_custom_policy(policy_module: str) -> None:
    CachePolicyFactory.register_cache_policy("mine", policy_module, "MyPolicy")
    cls = CachePolicyFactory.get_cache_policy_cls("mine")
    assert cls.__name__ == "MyPolicy"
    assert CachePolicyFactory.available_cache_policies()["mine"] == "My out-of-tree policy."


def test_out_of_tree_by_module_path_logs_experimental_warning(
    policy_module: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="kvoffload.policies.factory"):
        cls = CachePolicyFactory.get_cache_policy_cls("MyPolicy", policy_module)
    assert cls.__name__ == "MyPolicy"
    assert "experimental" in caplog.text


def test_out_of_tree_by_module_colon_class(policy_module: str) -> None:
    cls = CachePolicyFactory.get_cache_policy_cls(f"{policy_module}:MyPolicy")
    assert cls.__name__ == "MyPolicy"


def test_not_a_policy_is_a_type_error(policy_module: str) -> None:
    with pytest.raises(TypeError, match=r"NotAPolicy.*not a subclass of"):
        CachePolicyFactory.get_cache_policy_cls("NotAPolicy", policy_module)


def test_missing_class_lists_the_module_policies(policy_module: str) -> None:
    with pytest.raises(ImportError, match=r"no class 'Missing'.*\['LRUCachePolicy', 'MyPolicy'\]"):
        CachePolicyFactory.get_cache_policy_cls("Missing", policy_module)


def test_unimportable_module_is_import_error_chained() -> None:
    with pytest.raises(ImportError, match=r"'X'.*'no_such_module_abc'") as info:
        CachePolicyFactory.get_cache_policy_cls("X", "no_such_module_abc")
    assert isinstance(info.value.__cause__, ImportError)


def test_bad_names() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        CachePolicyFactory.get_cache_policy_cls("")
    with pytest.raises(ValueError, match="part is empty"):
        CachePolicyFactory.get_cache_policy_cls("mod:")


class _FakeDist:
    name = "fake-policy-dist"


def _fake_entry_points(module: str) -> list[metadata.EntryPoint]:
    ep = metadata.EntryPoint(
        name="fancy", value=f"{module}:MyPolicy", group="kvoffload.cache_policies"
    )
    object.__setattr__(ep, "dist", _FakeDist())  # EntryPoint is immutable; tests only
    return [ep]


def test_entry_point_policy_is_found_lazily(
    policy_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(factory_module, "_entry_points", lambda: _fake_entry_points(policy_module))
    assert policy_module not in sys.modules
    names = CachePolicyFactory.registered_names()
    assert "fancy" not in names  # not registered up front, found at lookup
    assert policy_module not in sys.modules
    cls = CachePolicyFactory.get_cache_policy_cls("fancy")
    assert cls.__name__ == "MyPolicy"
    infos = {info.name: info for info in CachePolicyFactory.describe_cache_policies()}
    assert infos["fancy"].source == "entry point (fake-policy-dist)"
    assert infos["fancy"].description == "My out-of-tree policy."


def test_entry_point_appears_in_unknown_name_error(
    policy_module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(factory_module, "_entry_points", lambda: _fake_entry_points(policy_module))
    with pytest.raises(ValueError, match="'fancy'"):
        CachePolicyFactory.get_cache_policy_cls("unknown-one")


def test_real_installed_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A throwaway distribution on sys.path advertising a policy through its metadata."""
    (tmp_path / "ep_policy_pkg.py").write_text(textwrap.dedent(POLICY_SOURCE))
    dist_info = tmp_path / "ep_policy_pkg-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ep-policy-pkg\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[kvoffload.cache_policies]\nep-policy = ep_policy_pkg:MyPolicy\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = CachePolicyFactory.get_cache_policy_cls("ep-policy")
        assert cls.__name__ == "MyPolicy"
        assert (
            CachePolicyFactory.available_cache_policies()["ep-policy"] == "My out-of-tree policy."
        )
    finally:
        sys.modules.pop("ep_policy_pkg", None)


def test_available_policies_does_not_import_builtins() -> None:
    import subprocess

    code = (
        "import sys; from kvoffload.policies import available_cache_policies;"
        "d = available_cache_policies(); print('lru' in d, 'kvoffload.policies.lru' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True False"


def test_snapshot_restores_registry() -> None:
    before = CachePolicyFactory.registered_names()
    with CachePolicyFactory.registry_snapshot():
        CachePolicyFactory.register_cache_policy("temp", "m", "C")
        CachePolicyFactory.unregister_cache_policy("lru")
    assert CachePolicyFactory.registered_names() == before
    assert CachePolicyFactory.get_cache_policy_cls("LRUCachePolicy") is LRUCachePolicy


def test_concurrent_registration_registers_each_name_once() -> None:
    errors: list[Exception] = []

    def register(i: int) -> None:
        try:
            CachePolicyFactory.register_cache_policy("race", "m", f"C{i}")
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert CachePolicyFactory.registered_names().count("race") == 1
    assert len(errors) == 15


def test_create_cache_policy_validates_params() -> None:
    policy = create_cache_policy("lru", 4)
    assert policy.cache_capacity == 4
    with pytest.raises(ValueError, match=r"Bad cache_policy_params for policy 'lru'.*bogus"):
        create_cache_policy("lru", 4, params={"bogus": 1})
    with pytest.raises(ValueError, match=">= 0"):
        create_cache_policy("lru", -1)
