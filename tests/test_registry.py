"""The generic Registry and what the policy registry gains from it: isolated, named failures."""

from __future__ import annotations

import logging
import sys
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from kvoffload import cli
from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory, available_cache_policies
from kvoffload.policies import factory as factory_module
from kvoffload.registry import Registry, load_object


class Base(ABC):
    """A plug-in base for these tests."""

    @abstractmethod
    def run(self) -> int: ...


class Concrete(Base):
    """A concrete plug-in."""

    def run(self) -> int:
        return 1


class Abstract(Base):
    """Still abstract."""


@pytest.fixture(autouse=True)
def isolated_registry() -> Iterator[None]:
    with CachePolicyFactory.registry_snapshot():
        yield


@pytest.fixture()
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Throwaway modules: a user's own ARCCachePolicy, one that raises, one that exits."""
    tag = tmp_path.name.replace("-", "_")
    sources = {
        "mine": '''
            from kvoffload.policies.lru import LRUCachePolicy

            class ARCCachePolicy(LRUCachePolicy):
                """The user's own ARC."""
            ''',
        "boom": 'raise RuntimeError("boom at import")',
        "exits": "import sys\nsys.exit(3)",
    }
    names = {}
    for key, source in sources.items():
        names[key] = f"reg_{key}_{tag}"
        (tmp_path / f"{names[key]}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield names
    for name in names.values():
        sys.modules.pop(name, None)


# ---------------------------------------------------------------------------- Registry itself


def test_a_registry_of_subclasses_loads_lazily_and_checks_the_base() -> None:
    reg = Registry.of_subclasses("widget", Base)
    reg.register("c", f"{__name__}:Concrete", aliases=("Concrete",))
    reg.register("a", f"{__name__}:Abstract")
    reg.register("lazy", "no_such_module_for_registry_test:X")
    assert "no_such_module_for_registry_test" not in sys.modules
    assert reg.resolve("c") is Concrete and reg.resolve("Concrete") is Concrete
    assert reg.resolve(f"{__name__}:Concrete") is Concrete
    assert reg.resolve("Concrete", __name__) is Concrete
    with pytest.raises(TypeError, match=r"Widget 'a' resolved to Abstract, which is abstract"):
        reg.resolve("a")
    with pytest.raises(TypeError, match=r"'Base'.*abstract.*run"):
        reg.resolve("Base", __name__)
    with pytest.raises(TypeError, match="not a subclass of"):
        reg.resolve(f"{__name__}:pytest")
    with pytest.raises(ImportError, match=r"widget 'lazy'.*no_such_module_for_registry_test"):
        reg.resolve("lazy")
    with pytest.raises(ValueError, match=r"Widget 'c' is already registered\."):
        reg.register("c", f"{__name__}:Concrete")


def test_a_registry_takes_loader_callables_and_any_check() -> None:
    def as_int(name: str, obj: object) -> int:
        if not isinstance(obj, int):
            raise TypeError(f"{name} is not an int")
        return obj

    reg: Registry[int] = Registry("number", as_int)
    reg.register("seven", lambda: 7, description="Seven.")
    reg.register("bad", lambda: "x")
    assert reg.resolve("seven") == 7
    with pytest.raises(TypeError, match="bad is not an int"):
        reg.resolve("bad")
    described = {e.name: e for e in reg.describe()}
    assert described["seven"].description == "Seven." and described["seven"].error is None
    assert described["bad"].error == "bad is not an int"


def test_snapshot_restores_names_and_aliases() -> None:
    reg = Registry.of_subclasses("widget", Base)
    reg.register("c", f"{__name__}:Concrete", aliases=("Concrete",))
    with reg.snapshot():
        reg.unregister("c")
        reg.register("d", f"{__name__}:Concrete")
        with pytest.raises(ValueError, match="Unknown widget: 'Concrete'"):
            reg.resolve("Concrete")
    assert reg.names() == ["c"] and reg.resolve("Concrete") is Concrete


def test_unknown_names_get_a_case_insensitive_did_you_mean() -> None:
    reg = Registry.of_subclasses("widget", Base, module_path_key="widget_module_path")
    reg.register("lru", f"{__name__}:Concrete")
    for typo in ("LRU", "lruu", "Lru"):
        with pytest.raises(ValueError) as info:
            reg.resolve(typo)
        assert f"Unknown widget: '{typo}'. Did you mean 'lru'?" in str(info.value)
        assert "widget_module_path" in str(info.value)
    with pytest.raises(ValueError) as info:
        reg.resolve("zzzzzz")
    assert "Did you mean" not in str(info.value)


def test_load_object_names_a_module_that_raises(modules: dict[str, str]) -> None:
    with pytest.raises(ImportError, match=rf"'{modules['boom']}' raised RuntimeError: boom"):
        load_object(f"{modules['boom']}:X", "admission filter")
    with pytest.raises(ImportError, match=r"called sys.exit\(3\)"):
        load_object(f"{modules['exits']}:X", "admission filter")


# ---------------------------------------------------------------------------- policies


def test_a_module_path_wins_over_our_class_name_aliases(modules: dict[str, str]) -> None:
    cls = CachePolicyFactory.get_cache_policy_cls("ARCCachePolicy", modules["mine"])
    assert cls.__module__ == modules["mine"] and cls.__doc__ == "The user's own ARC."
    # without a module path the alias still names ours
    assert CachePolicyFactory.get_cache_policy_cls("ARCCachePolicy").__module__ == (
        "kvoffload.policies.arc"
    )


def test_wrong_types_and_the_abstract_base_are_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"module path must be a module name string.*int 123"):
        CachePolicyFactory.get_cache_policy_cls("zzz", 123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a string"):
        CachePolicyFactory.get_cache_policy_cls(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"'CachePolicy' resolved to CachePolicy.*abstract"):
        CachePolicyFactory.get_cache_policy_cls("CachePolicy", "kvoffload.policies.base")


@pytest.mark.parametrize("typo", ["LRU", "lruu"])
def test_unknown_policy_did_you_mean(typo: str) -> None:
    with pytest.raises(ValueError, match=rf"Unknown cache policy: '{typo}'. Did you mean 'lru'\?"):
        CachePolicyFactory.get_cache_policy_cls(typo)


def test_a_registered_name_with_a_missing_module_path_is_an_error() -> None:
    with pytest.raises(ImportError, match=r"'lru'.*'nonexistent_mod_xyz'"):
        CachePolicyFactory.get_cache_policy_cls("lru", "nonexistent_mod_xyz")
    # a module path that imports but lacks the name keeps vLLM's meaning: the registered one
    lru = CachePolicyFactory.get_cache_policy_cls("lru")
    assert CachePolicyFactory.get_cache_policy_cls("lru", "kvoffload.policies.base") is lru


def test_a_module_that_raises_or_exits_is_named(modules: dict[str, str]) -> None:
    with pytest.raises(ImportError, match=rf"'{modules['boom']}' raised RuntimeError: boom"):
        CachePolicyFactory.get_cache_policy_cls("X", modules["boom"])
    with pytest.raises(ImportError, match=rf"'{modules['exits']}' called sys.exit\(3\)"):
        CachePolicyFactory.get_cache_policy_cls(f"{modules['exits']}:X")


def test_a_registered_policy_that_raises_at_import_hides_nothing(
    modules: dict[str, str],
) -> None:
    CachePolicyFactory.register_cache_policy("broken", modules["boom"], "Broken")
    CachePolicyFactory.register_cache_policy("quits", modules["exits"], "Quits")
    listed = available_cache_policies()
    for name, *_ in BUILTIN_POLICIES:
        assert name in listed
    assert modules["boom"] in listed["broken"] and "boom at import" in listed["broken"]
    assert "sys.exit(3)" in listed["quits"]


def _entry_points(*pairs: tuple[str, str]) -> list[metadata.EntryPoint]:
    group = "kvoffload.cache_policies"
    return [metadata.EntryPoint(name=n, value=v, group=group) for n, v in pairs]


def test_a_broken_entry_point_hides_nothing(
    modules: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    eps = _entry_points(
        ("ep-boom", f"{modules['boom']}:Broken"),
        ("ep-mine", f"{modules['mine']}:ARCCachePolicy"),
    )
    monkeypatch.setattr(factory_module, "_entry_points", lambda: eps)
    listed = available_cache_policies()
    assert listed["ep-mine"] == "The user's own ARC."
    assert "ep-boom" in listed and modules["boom"] in listed["ep-boom"]
    assert all(name in listed for name, *_ in BUILTIN_POLICIES)
    with pytest.raises(ImportError, match=r"'ep-boom'.*boom at import"):
        CachePolicyFactory.get_cache_policy_cls("ep-boom")


def test_a_broken_adapter_is_skipped_with_a_warning(
    modules: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bad = metadata.EntryPoint(
        name="bad", value=f"{modules['boom']}:f", group="kvoffload.policy_adapters"
    )
    real = metadata.entry_points

    def entry_points(**kwargs: str) -> object:
        if kwargs.get("group") == "kvoffload.policy_adapters":
            return [bad]
        return real(**kwargs)

    monkeypatch.setattr(factory_module.metadata, "entry_points", entry_points)
    with (
        caplog.at_level(logging.WARNING, logger="kvoffload.policies.factory"),
        pytest.raises(TypeError, match="not a subclass of"),
    ):
        CachePolicyFactory.get_cache_policy_cls("Path", "pathlib")
    assert "Skipping cache policy adapter 'bad'" in caplog.text


# ---------------------------------------------------------------------------- the command


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvoffload: error: ")
    return err


def test_cli_policy_module_errors_are_reported(
    modules: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    small = ("--requests", "30", "--capacity", "50", "--no-bounds", "--workers", "1")
    err = _error(capsys, "simulate", *small, "--policy", "lru", "--policy-module", "nonexistent_m")
    assert "nonexistent_m" in err
    err = _error(capsys, "simulate", *small, "--policy", "X", "--policy-module", modules["boom"])
    assert modules["boom"] in err and "boom at import" in err
    err = _error(capsys, "simulate", *small, "--policy", f"{modules['exits']}:X")
    assert modules["exits"] in err and "sys.exit(3)" in err


def test_a_class_that_stands_for_a_builtin_resolves_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vLLM config naming kvoffload's vLLM class gives our own policy, not a double wrap."""
    name = f"reg_standin_{tmp_path.name.replace('-', '_')}"
    source = """
        class S3FIFOCachePolicy:  # what kvoffload.integrations.vllm generates, minus vLLM
            kvoffload_policy = "s3fifo"

        class Tuned:
            kvoffload_policy = "s3fifo"
            kvoffload_params = {"small_ratio": 0.2}
        """
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        ours = CachePolicyFactory.get_cache_policy_cls("s3fifo")
        assert CachePolicyFactory.get_cache_policy_cls("S3FIFOCachePolicy", name) is ours
        with pytest.raises(TypeError, match="not a subclass of"):  # parameters cannot carry over
            CachePolicyFactory.get_cache_policy_cls("Tuned", name)
    finally:
        sys.modules.pop(name, None)


def test_describe_reports_a_check_that_fails_oddly_and_lists_the_rest() -> None:
    def fussy(name: str, obj: object) -> object:
        if name == "odd":
            raise KeyError("no such key")
        return obj

    reg: Registry[object] = Registry("thing", fussy)
    reg.register("odd", lambda: 1)
    reg.register("fine", lambda: Concrete)
    described = {e.name: e for e in reg.describe()}
    assert described["odd"].error == "KeyError: 'no such key'"
    assert described["fine"].description == "A concrete plug-in."
