"""CachePolicyFactory: policies registered by name with lazy loaders, plus out-of-tree loading.

Resolution order for ``get_cache_policy_cls(name, module_path)``:

1. a registered name (``"lru"``) or a registered policy's class name (``"LRUCachePolicy"``);
2. ``"package.module:ClassName"`` in ``name`` itself;
3. ``module_path`` given: ``ClassName`` = ``name`` imported from that module (vLLM's
   ``cache_policy_module_path``; logs a warning that out-of-tree loading is experimental);
4. an installed distribution's entry point named ``name`` in the group
   ``kvoffload.cache_policies`` (loaded only now, never at import time);
5. otherwise ``ValueError`` listing the known names.

Nothing is imported at registration. Errors are ``ValueError`` (unknown / duplicate name),
``ImportError`` (module or class cannot be loaded) or ``TypeError`` (not a ``CachePolicy``).
A class written for another engine's policy API (vLLM's ``CachePolicy``) is wrapped by the
first adapter advertised under the entry-point group ``kvoffload.policy_adapters`` that
recognises it (kvoffload's own adapter for vLLM is one); adapters are loaded only then.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from kvoffload.policies.base import CachePolicy

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kvoffload.cache_policies"
ADAPTER_ENTRY_POINT_GROUP = "kvoffload.policy_adapters"

PolicyLoader = Callable[[], type[CachePolicy]]


@dataclass(frozen=True)
class PolicyInfo:
    """What ``kvoffload policies`` shows for one resolvable policy."""

    name: str
    description: str
    source: str  # "built-in", "registered" or "entry point (<distribution>)"
    target: str  # "module:ClassName"


@dataclass(frozen=True)
class _Registration:
    module_path: str
    class_name: str
    description: str | None
    source: str


def _first_line(doc: str | None) -> str:
    if not doc:
        return ""
    for line in inspect.cleandoc(doc).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _import_module(policy_name: str, module_path: str) -> ModuleType:
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        raise ImportError(
            f"Cannot load cache policy '{policy_name}': importing module '{module_path}' "
            f"failed: {exc}"
        ) from exc


def _policy_classes_in(module: ModuleType) -> list[str]:
    return sorted(
        attr
        for attr, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, CachePolicy) and value is not CachePolicy
    )


def _load_class(policy_name: str, module_path: str, class_name: str) -> type[CachePolicy]:
    module = _import_module(policy_name, module_path)
    try:
        obj = getattr(module, class_name)
    except AttributeError:
        found = _policy_classes_in(module)
        raise ImportError(
            f"Cannot load cache policy '{policy_name}': module '{module_path}' has no class "
            f"'{class_name}'. CachePolicy subclasses in that module: {found or 'none'}."
        ) from None
    return _check_policy_class(policy_name, obj)


def _adapt_foreign_class(obj: object) -> type[CachePolicy] | None:
    """Ask the installed policy adapters to wrap a class written for another engine's API."""
    if not inspect.isclass(obj):
        return None
    for entry_point in metadata.entry_points(group=ADAPTER_ENTRY_POINT_GROUP):
        adapted = entry_point.load()(obj)
        if adapted is not None:
            return _check_policy_class(obj.__qualname__, adapted)
    return None


def _check_policy_class(policy_name: str, obj: object) -> type[CachePolicy]:
    if inspect.isclass(obj) and not issubclass(obj, CachePolicy):
        adapted = _adapt_foreign_class(obj)
        if adapted is not None:
            return adapted
    if not (inspect.isclass(obj) and issubclass(obj, CachePolicy)):
        what = obj.__qualname__ if inspect.isclass(obj) else type(obj).__name__ + " instance"
        raise TypeError(
            f"Cache policy '{policy_name}' resolved to {what}, which is not a subclass of "
            "kvoffload.policies.base.CachePolicy."
        )
    return obj


class CachePolicyFactory:
    """Registry of cache policies: names -> lazy loaders (class-level, process-wide)."""

    _registry: dict[str, _Registration] = {}
    _class_aliases: dict[str, str] = {}
    _lock = threading.RLock()

    @classmethod
    def register_cache_policy(
        cls,
        name: str,
        module_path: str,
        class_name: str,
        description: str | None = None,
        *,
        _source: str = "registered",
    ) -> None:
        """Register ``name`` -> ``module_path.class_name`` without importing anything.

        ``description`` (one line) lets listings skip the import; without it the class
        docstring's first line is used when someone asks.
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"Cache policy name must be a non-empty string, got {name!r}.")
        with cls._lock:
            if name in cls._registry:
                raise ValueError(f"Cache policy '{name}' is already registered.")
            cls._registry[name] = _Registration(module_path, class_name, description, _source)
            cls._class_aliases.setdefault(class_name, name)

    @classmethod
    def unregister_cache_policy(cls, name: str) -> None:
        """Remove ``name`` (mainly for tests and plugin reloads)."""
        with cls._lock:
            reg = cls._registry.pop(name, None)
            if reg is None:
                raise ValueError(f"Cache policy '{name}' is not registered.")
            if cls._class_aliases.get(reg.class_name) == name:
                del cls._class_aliases[reg.class_name]

    @classmethod
    def registered_names(cls) -> list[str]:
        """Registered short names, in registration order."""
        with cls._lock:
            return list(cls._registry)

    @classmethod
    def _loader(cls, name: str) -> PolicyLoader | None:
        with cls._lock:
            reg = cls._registry.get(name)
            if reg is None:
                alias = cls._class_aliases.get(name)
                reg = cls._registry.get(alias) if alias is not None else None
        if reg is None:
            return None
        registration = reg
        return lambda: _load_class(name, registration.module_path, registration.class_name)

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type[CachePolicy]:
        """Resolve ``name`` to a ``CachePolicy`` subclass (see the module docstring for order)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"Cache policy name must be a non-empty string, got {name!r}.")
        loader = cls._loader(name)
        if loader is not None:
            return loader()
        if ":" in name:
            mod, _, class_name = name.partition(":")
            if not mod or not class_name:
                raise ValueError(
                    f"Cache policy '{name}' looks like 'module:ClassName' but a part is empty."
                )
            logger.warning(
                "Loading out-of-tree cache policy '%s' from module '%s': out-of-tree policy "
                "loading is experimental.",
                class_name,
                mod,
            )
            return _load_class(name, mod, class_name)
        if module_path:
            logger.warning(
                "Loading out-of-tree cache policy '%s' from module '%s': out-of-tree policy "
                "loading is experimental.",
                name,
                module_path,
            )
            return _load_class(name, module_path, name)
        entry_point = _find_entry_point(name)
        if entry_point is not None:
            try:
                obj = entry_point.load()
            except ImportError as exc:
                raise ImportError(
                    f"Cannot load cache policy '{name}' from entry point '{entry_point.value}': "
                    f"{exc}"
                ) from exc
            return _check_policy_class(name, obj)
        known = sorted(set(cls.registered_names()) | {ep.name for ep in _entry_points()})
        raise ValueError(
            f"Unknown cache policy: '{name}'. Supported: {known}. For an out-of-tree policy, "
            "also set cache_policy_module_path (or pass 'package.module:ClassName')."
        )

    @classmethod
    def describe_cache_policies(cls) -> list[PolicyInfo]:
        """Every resolvable-by-name policy with a one-line description and its origin."""
        with cls._lock:
            regs = list(cls._registry.items())
        infos = []
        for name, reg in regs:
            description = reg.description
            if description is None:
                try:
                    description = _first_line(
                        _load_class(name, reg.module_path, reg.class_name).__doc__
                    )
                except (ImportError, TypeError) as exc:
                    description = f"(cannot be loaded: {exc})"
            infos.append(
                PolicyInfo(name, description, reg.source, f"{reg.module_path}:{reg.class_name}")
            )
        seen = {info.name for info in infos}
        for ep in _entry_points():
            if ep.name in seen:
                continue
            seen.add(ep.name)
            try:
                description = _first_line(_check_policy_class(ep.name, ep.load()).__doc__)
            except (ImportError, TypeError) as exc:
                description = f"(cannot be loaded: {exc})"
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            infos.append(PolicyInfo(ep.name, description, f"entry point ({dist})", ep.value))
        return infos

    @classmethod
    def available_cache_policies(cls) -> dict[str, str]:
        """Name -> one-line description for every policy resolvable by name."""
        return {info.name: info.description for info in cls.describe_cache_policies()}

    @classmethod
    @contextmanager
    def registry_snapshot(cls) -> Iterator[None]:
        """Restore the registry to its current content on exit (for tests)."""
        with cls._lock:
            saved = dict(cls._registry), dict(cls._class_aliases)
        try:
            yield
        finally:
            with cls._lock:
                cls._registry.clear()
                cls._registry.update(saved[0])
                cls._class_aliases.clear()
                cls._class_aliases.update(saved[1])


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


def _find_entry_point(name: str) -> metadata.EntryPoint | None:
    for ep in _entry_points():
        if ep.name == name:
            return ep
    return None


def get_cache_policy_cls(name: str, module_path: str | None = None) -> type[CachePolicy]:
    """Shortcut for :meth:`CachePolicyFactory.get_cache_policy_cls`."""
    return CachePolicyFactory.get_cache_policy_cls(name, module_path)


def available_cache_policies() -> dict[str, str]:
    """Shortcut for :meth:`CachePolicyFactory.available_cache_policies`."""
    return CachePolicyFactory.available_cache_policies()


def create_cache_policy(
    name: str,
    cache_capacity: int,
    module_path: str | None = None,
    params: dict[str, object] | None = None,
) -> CachePolicy:
    """Resolve ``name`` and build it, turning a bad parameter into a clear ``ValueError``."""
    policy_cls = CachePolicyFactory.get_cache_policy_cls(name, module_path)
    params = dict(params or {})
    try:
        inspect.signature(policy_cls).bind(cache_capacity=cache_capacity, **params)
    except TypeError as exc:
        accepted = [
            p.name
            for p in inspect.signature(policy_cls).parameters.values()
            if p.name != "cache_capacity" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise ValueError(
            f"Bad cache_policy_params for policy '{name}': {exc}. "
            f"Accepted parameters: {accepted or 'none'}."
        ) from None
    return policy_cls(cache_capacity=cache_capacity, **params)


__all__ = [
    "ENTRY_POINT_GROUP",
    "CachePolicyFactory",
    "PolicyInfo",
    "available_cache_policies",
    "create_cache_policy",
    "get_cache_policy_cls",
]
